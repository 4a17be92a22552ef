"""The suite's shared fixtures (the stack, the Lambda runtime emulation, the stream
mapping, the Kafka reader, fresh tables and topics) are added here as the tests need
them."""
