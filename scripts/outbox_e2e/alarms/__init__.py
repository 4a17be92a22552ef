"""A small evaluator of the CloudWatch metric alarms of template.yaml over EMF documents.

Tests feed it what a scenario printed (the relay function's stdout, EMF documents mixed
with other log lines) and, for the alarms on AWS/Lambda metrics, datapoints given
directly; it replays CloudWatch's alarm evaluation in simulated time and reports each
alarm's state transitions as JSON.

Sources (the text of these pages was read in their source repository,
awsdocs/amazon-cloudwatch-user-guide, commit b355497 "Periodic Update 05/17/2023"):

- "Using Amazon CloudWatch alarms", section "Evaluating an alarm":
  https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/AlarmThatSendsEmail.html
- "Configuring how CloudWatch alarms treat missing data" (with "How alarm state is
  evaluated when data is missing" and "Avoiding premature transitions to alarm state"):
  https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/alarms-and-missing-data.html
- "CloudWatch statistics definitions":
  https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/Statistics-definitions.html
- "Amazon CloudWatch concepts" (dimensions, units, periods, resolution):
  https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/cloudwatch_concepts.html
- "Specification: Embedded metric format":
  https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html
- "Setting alarms on metrics created with the embedded metric format":
  https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Alarms.html
- "AWS::CloudWatch::Alarm" (CloudFormation; a new alarm starts in INSUFFICIENT_DATA):
  https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-cloudwatch-alarm.html
- AWS Knowledge Center, "Why did my CloudWatch alarm send me a notification after a
  single breached data point?":
  https://repost.aws/knowledge-center/cloudwatch-alarm-single-data-point

What it models
--------------
Template: the `AWS::CloudWatch::Alarm` resources of a CloudFormation YAML template
(short-form intrinsics read by a small PyYAML loader). Parameters take their Default,
overridden by `params`; `Conditions` are evaluated (Fn::Equals, Not, And, Or, Condition);
Ref, Fn::Sub, Fn::If, Fn::Join, Fn::Select, Fn::Split, Fn::GetAtt, Fn::FindInMap and
AWS::NoValue are resolved. A Ref to a resource is the resource's logical id unless
`resource_names` names it; Fn::GetAtt gives "Logical.Attr" unless `resource_attrs` does;
pseudo parameters (AWS::StackName, AWS::Region, ...) have fixed test values unless
`pseudo` overrides them. An alarm whose Condition is false is absent. DatapointsToAlarm
defaults to EvaluationPeriods, TreatMissingData to `missing`.

EMF ("Specification: Embedded metric format"): a line is an EMF document when, from its
first "{" on (Lambda may prepend metadata), it is a JSON object whose `_aws` member has
`CloudWatchMetrics`. A document is rejected whole (listed in `rejected`, no datapoint)
when it breaks the specification: no integer `_aws.Timestamp`, a directive without a
non-empty Namespace, Dimensions (an array of arrays of at most 30 keys) or Metrics (at
most 100 definitions with a Name), a dimension key whose root member is not a string, or
a metric target that is not a number or an array of 1 to 100 numbers. Every value of an
array target is one sample; every dimension set of a directive makes its own metric (the
identity is namespace, metric name and the exact set of dimension names and values).
A metric's Unit (default None) and StorageResolution (default 60) come along; a
standard-resolution sample is stored at the start of its minute. The specification
(2023 text) allows only a number or an array of numbers as a metric target: an object
with `Values`/`Counts` (a PutMetricData-style histogram) is not EMF and is rejected.

Datapoints that do not come from EMF (AWS/Lambda Errors, Invocations, Throttles,
Duration, ...) are passed directly: {namespace, metric, dimensions, timestamp, value or
values, unit}, see `samples_from_records`.

Aggregation ("CloudWatch statistics definitions", "concepts"): per period, over the
samples of the alarm's metric (and of its Unit when the alarm names one): SampleCount,
Sum, Average (Sum/SampleCount), Minimum, Maximum, and the ExtendedStatistic pNN or
pNN.N (nearest rank: the ceil(p/100 * n)-th smallest sample; CloudWatch's percentile
algorithm is not documented, so percentiles are an approximation here).

Evaluation ("Evaluating an alarm"): an alarm with a period of a minute or more is
evaluated every minute, at whole minutes, over the periods ending at that minute (a
5-minute period at the end of minute 6 covers minutes 2 to 6); an alarm with a 10 or 30
second period every 10 seconds. The k-th most recent period at evaluation time T is
[T - k*Period, T - (k-1)*Period). A period with no sample is missing. A datapoint
breaches when it compares with Threshold as ComparisonOperator says
(GreaterThanOrEqualToThreshold, GreaterThanThreshold, LessThanThreshold,
LessThanOrEqualToThreshold). The alarm starts in INSUFFICIENT_DATA at `start`.

Missing data ("How alarm state is evaluated when data is missing"): each evaluation
looks at an evaluation range of more periods than EvaluationPeriods (N); AWS documents
the range only by its example (N = 3, range 5), so the range here is N + 2 unless
`evaluation_range` says otherwise. Then, with M = DatapointsToAlarm:
1. at least N real datapoints in the range: the N most recent real ones decide
   (ALARM when at least M breach, else OK); TreatMissingData is not used;
2. fewer than N: every real datapoint of the range counts, plus N - (real ones) filled
   datapoints: `breaching` fills breaching ones, `notBreaching` non-breaching ones,
   ALARM when at least M breach, else OK;
3. fewer than N with `missing` or `ignore`: no datapoint at all gives INSUFFICIENT_DATA
   (`missing`) or keeps the state (`ignore`); at least M breaching real ones give ALARM;
   a non-breaching real one gives OK; otherwise (only breaching real ones, fewer than M)
   `missing` goes to ALARM when the oldest breaching one is at least M periods old
   ("Avoiding premature transitions to alarm state"), else INSUFFICIENT_DATA, and
   `ignore` keeps the state.
This reproduces every row of the two tables of the AWS page (3 of 3 and 2 of 3), which
e2e/test_alarms.py checks. Alarms on the AWS/DynamoDB namespace always ignore
missing data, as the page says.

What it does not model
----------------------
Alarm actions (AlarmActions, OKActions, InsufficientDataActions, ActionsEnabled: only
transitions are reported), composite alarms, metric math alarms (`Metrics`: reported as
unsupported), anomaly detection (the LessThanLowerOrGreaterThanUpperThreshold family),
EvaluateLowSampleCountPercentile, the statistics other than the five and pNN (trimmed
mean, winsorized mean, percentile rank, trimmed count and sum, IQM), the delay between a
log line and its metric (EMF ingestion) and between a period's end and its evaluation,
late datapoints that change an already evaluated period, the evaluation range of other
sizes than the documented example (see above), the retention and aggregation of old
data, EMF timestamps too far in the past or future, unit conversion, metric streams,
and the time limits on Period x EvaluationPeriods.

CLI: `python3 scripts/alarms.py --param AlarmTopicArn=arn:... --emf relay.log` prints
{"alarms": {LogicalId: {config, transitions, final_state}}, "emf": {...}}; see --help.

Metric filters and Lambda's log-level filtering (metric_filter.py): a JSON filter pattern
(=, !=, &&, ||, parentheses) over log lines gives the datapoints a metric filter without a
DefaultValue publishes; `lambda_log_level_filter` keeps the lines Lambda sends to
CloudWatch Logs at an ApplicationLogLevel (a line without a "level" is INFO), so a test
can show which EMF documents reach CloudWatch at all.

Layout: template.py (the template's alarms, resolved), emf.py (samples from EMF documents
and from direct datapoints), metric_filter.py (metric filters, log-level filtering),
evaluate.py (statistics, the M-of-N and missing-data rules, the replay), cli.py (the
command).
"""

from .emf import EmfRead, Sample, iso, parse_time, read_emf, samples_from_records
from .evaluate import (ALARM, INSUFFICIENT_DATA, OK, Evaluation, decide, evaluate, evaluate_all,
                       matching_samples, statistic)
from .metric_filter import compile_pattern, filter_samples, lambda_log_level_filter
from .template import Alarm, AlarmError, alarm_from_properties, load_template, resolve_alarms

__all__ = [
    "ALARM", "INSUFFICIENT_DATA", "OK", "Alarm", "AlarmError", "EmfRead", "Evaluation", "Sample",
    "alarm_from_properties", "compile_pattern", "decide", "evaluate", "evaluate_all",
    "filter_samples", "iso", "lambda_log_level_filter", "load_template", "matching_samples",
    "parse_time", "read_emf", "resolve_alarms", "samples_from_records", "statistic",
]
