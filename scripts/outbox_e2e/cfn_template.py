"""Reads what the local model of Lambda needs out of the SAM template (template.yaml):
the settings of a function's DynamoDB stream event source mapping and of its
asynchronous invocations (EventInvokeConfig), so that the stream mapping's poller
(scripts/streams.py poll) and the Lambda emulator (scripts/lambda_runtime.py) run with the
template's own values.

  scripts/cfn_template.py template.yaml --function RelayFunction [--param K=V ...]
                          [--environment]

prints {"mapping": {...}, "event_invoke_config": {...}} as JSON (the resolved
properties; "mapping" is null when the function has no stream mapping under these
parameters); with --environment also "environment", the function's variables (the
Globals' merged with its own; every parameter they name needs a Default or a --param).

A small resolver, not CloudFormation: the YAML short forms (!Ref, !If, !Sub, !Join,
!Select, !Split, !Equals, !Not, !And, !Or, !Condition, !GetAtt) are read with
PyYAML, parameters take their Default, overridden by --param K=V; pseudo parameters
get local values (AWS::Region from $AWS_REGION or us-east-1, AWS::AccountId
123456789012, AWS::Partition aws, AWS::StackName local); conditions are evaluated;
AWS::NoValue removes the property.  A !Ref or !GetAtt of a resource resolves to a
placeholder ("<RelayFunction>", "<OutboxTable.StreamArn>"): the model never needs a
deployed resource's name.

The mapping: an AWS::Lambda::EventSourceMapping resource whose FunctionName is !Ref
(or !GetAtt ...Arn) of the function, or an event of Type DynamoDB under the SAM
function's Events; with its Condition evaluated (false: no mapping).  The
EventInvokeConfig: the SAM function's EventInvokeConfig (over the Globals'), or an
AWS::Lambda::EventInvokeConfig resource for the function; missing settings take
Lambda's defaults, MaximumRetryAttempts 2 and MaximumEventAgeInSeconds 21600
("Configuring error handling settings for Lambda asynchronous invocations",
https://docs.aws.amazon.com/lambda/latest/dg/invocation-async-configuring.html; the
SAM property, "EventInvokeConfiguration",
https://docs.aws.amazon.com/serverless-application-model/latest/developerguide/sam-property-function-eventinvokeconfiguration.html).

For the template's tests (e2e/test_template.py), the same resolver over any template document
(Template.from_doc, e.g. SAM's translation): keep_refs=True keeps a !Ref or !GetAtt of a
resource as the intrinsic (and a !Sub or !Join that contains one as a !Sub or !Join of
the resolved rest), so that resolved() is a deployable template for one set of parameter
values (Conditions evaluated, resources and outputs whose condition is false left out,
AWS::NoValue removed); failed_rules() evaluates the Rules section (Fn::Contains too).

Needs PyYAML (in the stack's venv).  Exit codes: 0 ok, 2 usage or an unreadable
template.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import yaml

ASYNC_DEFAULTS = {"MaximumRetryAttempts": 2, "MaximumEventAgeInSeconds": 21600}


class TemplateError(Exception):
    pass


class _Loader(yaml.SafeLoader):
    pass


def _short_form(loader, suffix, node):
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    if suffix in ("Ref", "Condition"):
        return {suffix: value}
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {f"Fn::{suffix}": value}


_Loader.add_multi_constructor("!", _short_form)

_NOVALUE = object()


def load_yaml(path: str) -> dict:
    """A CloudFormation YAML template as a document, short forms as their long forms."""
    try:
        with open(path) as f:
            doc = yaml.load(f, _Loader)  # noqa: S506 (a SafeLoader subclass)
    except (OSError, yaml.YAMLError) as e:
        raise TemplateError(f"cannot read {path}: {e}") from e
    if not isinstance(doc, dict) or "Resources" not in doc:
        raise TemplateError(f"{path} is not a CloudFormation template")
    return doc


class Template:
    def __init__(self, path: str, params: dict[str, str] | None = None, *,
                 doc: dict | None = None, keep_refs: bool = False):
        self.doc = doc if doc is not None else load_yaml(path)
        self.keep_refs = keep_refs
        self.path = path
        declared = self.doc.get("Parameters") or {}
        self.params: dict[str, object] = {}
        for name, spec in declared.items():
            if "Default" in spec:
                self.params[name] = spec["Default"]
        for name, value in (params or {}).items():
            if name not in declared:
                raise TemplateError(f"--param {name}: the template has no such parameter")
            self.params[name] = value
        self.types = {name: spec.get("Type", "String") for name, spec in declared.items()}
        self.pseudo = {
            "AWS::Region": os.environ.get("AWS_REGION") or os.environ.get(
                "AWS_DEFAULT_REGION") or "us-east-1",
            "AWS::AccountId": "123456789012", "AWS::Partition": "aws",
            "AWS::StackName": "local", "AWS::URLSuffix": "amazonaws.com",
            "AWS::StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/local/0",
        }
        self.resources: dict = self.doc["Resources"]
        self._conditions: dict[str, bool] = {}

    @classmethod
    def from_doc(cls, doc: dict, params: dict | None = None, name: str = "<document>",
                 keep_refs: bool = True) -> "Template":
        return cls(name, params, doc=doc, keep_refs=keep_refs)

    # ---------------------------------------------------------------- resolve

    def ref(self, name: str):
        if name == "AWS::NoValue":
            return _NOVALUE
        if name in self.pseudo:
            return self.pseudo[name]
        if name in self.types:
            if name not in self.params:
                raise TemplateError(f"parameter {name} has no Default; give --param {name}=...")
            value = self.params[name]
            if self.types[name].startswith("CommaDelimitedList") or self.types[name].startswith(
                    "List<"):
                return value if isinstance(value, list) else [
                    x.strip() for x in str(value).split(",")]
            return value
        if name in self.resources:
            return {"Ref": name} if self.keep_refs else f"<{name}>"
        raise TemplateError(f"!Ref {name}: neither a parameter nor a resource")

    def condition(self, name: str) -> bool:
        if name not in self._conditions:
            conditions = self.doc.get("Conditions") or {}
            if name not in conditions:
                raise TemplateError(f"no condition {name}")
            self._conditions[name] = bool(self.resolve(conditions[name]))
        return self._conditions[name]

    def sub(self, text: str, extra: dict):
        kept = []

        def one(m):
            inner = m.group(1)
            if inner.startswith("!"):
                return "${" + inner[1:] + "}"
            if inner in extra:
                value = self.resolve(extra[inner])
                if isinstance(value, dict):  # a kept reference inside a variable
                    raise TemplateError(f"!Sub variable {inner} holds a resource reference")
                return str(value)
            if inner.split(".", 1)[0] in self.resources:
                if self.keep_refs:
                    kept.append(inner)
                    return m.group(0)
                return f"<{inner}>"
            return str(self.ref(inner))
        out = re.sub(r"\$\{([^}]+)\}", one, text)
        return {"Fn::Sub": out} if kept else out

    def resolve(self, v):
        if isinstance(v, list):
            out = [self.resolve(x) for x in v]
            return [x for x in out if x is not _NOVALUE]
        if not isinstance(v, dict):
            return v
        if len(v) == 1:
            (k, arg), = v.items()
            if k == "Ref":
                return self.ref(arg)
            if k == "Condition" and isinstance(arg, str):
                return self.condition(arg)
            if k == "Fn::If":
                cond, yes, no = arg
                return self.resolve(yes if self.condition(cond) else no)
            if k == "Fn::Equals":
                a, b = (self.resolve(x) for x in arg)
                return str(a) == str(b)
            if k == "Fn::Not":
                return not self.resolve(arg[0])
            if k == "Fn::And":
                return all(self.resolve(x) for x in arg)
            if k == "Fn::Or":
                return any(self.resolve(x) for x in arg)
            if k == "Fn::Sub":
                if isinstance(arg, list):
                    return self.sub(arg[0], arg[1] if len(arg) > 1 else {})
                return self.sub(arg, {})
            if k == "Fn::Join":
                sep, items = arg
                items = self.resolve(items)
                if any(isinstance(x, dict) for x in items):
                    return {"Fn::Join": [sep, items]}
                return str(sep).join(str(x) for x in items)
            if k == "Fn::Contains":
                items, value = (self.resolve(x) for x in arg)
                return value in items
            if k == "Fn::Select":
                i, items = arg
                return self.resolve(items)[int(self.resolve(i))]
            if k == "Fn::Split":
                sep, text = arg
                return str(self.resolve(text)).split(sep)
            if k == "Fn::GetAtt":
                if isinstance(arg, str):
                    arg = arg.split(".", 1)
                if self.keep_refs:
                    return {"Fn::GetAtt": list(arg)}
                return f"<{'.'.join(str(x) for x in arg)}>"
        out = {}
        for k, x in v.items():
            r = self.resolve(x)
            if r is not _NOVALUE:
                out[k] = r
        return out

    # ---------------------------------------------------------------- whole template

    def resolved(self) -> dict:
        """The template for these parameter values: resources and outputs whose Condition
        holds, their properties resolved; no Parameters, Conditions or Rules left."""
        out: dict = {"AWSTemplateFormatVersion": "2010-09-09", "Resources": {}}
        for name, res in self.resources.items():
            if not self._enabled(res):
                continue
            r = {k: v for k, v in res.items() if k != "Condition"}
            for key in ("Properties", "Metadata"):
                if key in r:
                    r[key] = self.resolve(r[key])
            out["Resources"][name] = r
        outputs = {}
        for name, o in (self.doc.get("Outputs") or {}).items():
            if "Condition" in o and not self.condition(o["Condition"]):
                continue
            outputs[name] = self.resolve({k: v for k, v in o.items() if k != "Condition"})
        if outputs:
            out["Outputs"] = outputs
        return out

    def failed_rules(self) -> list[tuple[str, str]]:
        """(rule, AssertDescription) of each assertion of the Rules section that fails for
        these parameter values, as CloudFormation would refuse the stack."""
        failed = []
        for name, rule in (self.doc.get("Rules") or {}).items():
            cond = rule.get("RuleCondition")
            if cond is not None and not self.resolve(cond):
                continue
            for a in rule.get("Assertions") or []:
                if not self.resolve(a["Assert"]):
                    failed.append((name, " ".join(str(a.get("AssertDescription", "")).split())))
        return failed

    # ---------------------------------------------------------------- lookups

    def _is_function_ref(self, raw, function: str) -> bool:
        if isinstance(raw, dict):
            if raw.get("Ref") == function:
                return True
            att = raw.get("Fn::GetAtt")
            if isinstance(att, list) and att and att[0] == function:
                return True
        return raw == function

    def _check_function(self, function: str) -> dict:
        res = self.resources.get(function)
        if not res or res.get("Type") not in ("AWS::Serverless::Function",
                                              "AWS::Lambda::Function"):
            raise TemplateError(f"{function} is not a function of {self.path}")
        return res

    def _enabled(self, res: dict) -> bool:
        return "Condition" not in res or self.condition(res["Condition"])

    def stream_mapping(self, function: str) -> dict | None:
        """The resolved properties of the function's DynamoDB stream mapping, with
        "LogicalId"; None when it has none under these parameters."""
        fn = self._check_function(function)
        found = []
        for name, res in self.resources.items():
            if res.get("Type") != "AWS::Lambda::EventSourceMapping":
                continue
            props = res.get("Properties") or {}
            if not self._is_function_ref(props.get("FunctionName"), function):
                continue
            if not self._enabled(res):
                continue
            resolved = self.resolve(props)
            if "StartingPosition" in resolved:  # a stream (SQS mappings have none)
                found.append(dict(resolved, LogicalId=name))
        if self._enabled(fn):
            for name, ev in ((fn.get("Properties") or {}).get("Events") or {}).items():
                if ev.get("Type") == "DynamoDB":
                    found.append(dict(self.resolve(ev.get("Properties") or {}),
                                      LogicalId=f"{function}.Events.{name}"))
        if len(found) > 1:
            raise TemplateError(f"{function} has {len(found)} stream mappings: "
                                f"{[m['LogicalId'] for m in found]}")
        return found[0] if found else None

    def environment(self, function: str) -> dict[str, str]:
        """The function's environment variables as Lambda would set them: the Globals'
        Environment.Variables, then the function's own (SAM merges the two, the
        function's winning), resolved; a variable resolving to AWS::NoValue is absent."""
        fn = self._check_function(function)
        out: dict[str, str] = {}
        glob = ((self.doc.get("Globals") or {}).get("Function") or {}).get("Environment")
        own = (fn.get("Properties") or {}).get("Environment")
        for env in (glob, own):
            variables = self.resolve((env or {}).get("Variables") or {})
            out.update({k: str(v) for k, v in variables.items()})
        return out

    def event_invoke_config(self, function: str) -> dict:
        """MaximumRetryAttempts and MaximumEventAgeInSeconds of the function's
        asynchronous invocations, with "Source" (where they came from)."""
        fn = self._check_function(function)
        out, source = dict(ASYNC_DEFAULTS), "Lambda's defaults"
        glob = ((self.doc.get("Globals") or {}).get("Function") or {}).get("EventInvokeConfig")
        if glob:
            out.update({k: v for k, v in self.resolve(glob).items() if k in ASYNC_DEFAULTS})
            source = "Globals.Function.EventInvokeConfig"
        own = (fn.get("Properties") or {}).get("EventInvokeConfig")
        if own:
            out.update({k: v for k, v in self.resolve(own).items() if k in ASYNC_DEFAULTS})
            source = f"{function}.EventInvokeConfig"
        for name, res in self.resources.items():
            if res.get("Type") == "AWS::Lambda::EventInvokeConfig" and self._enabled(res):
                props = res.get("Properties") or {}
                if self._is_function_ref(props.get("FunctionName"), function):
                    out.update({k: v for k, v in self.resolve(props).items()
                                if k in ASYNC_DEFAULTS})
                    source = name
        out = {k: int(v) for k, v in out.items()}
        out["Source"] = source
        return out


def parse_params(pairs: list[str]) -> dict[str, str]:
    out = {}
    for kv in pairs or []:
        if "=" not in kv:
            raise TemplateError(f"--param wants K=V, got {kv!r}")
        k, _, v = kv.partition("=")
        out[k] = v
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("template")
    p.add_argument("--function", required=True, help="the function's logical id")
    p.add_argument("--param", action="append", default=[], metavar="K=V")
    p.add_argument("--environment", action="store_true",
                   help="also print the function's environment variables")
    args = p.parse_args()
    try:
        tpl = Template(args.template, parse_params(args.param))
        out = {"mapping": tpl.stream_mapping(args.function),
               "event_invoke_config": tpl.event_invoke_config(args.function)}
        if args.environment:
            out["environment"] = tpl.environment(args.function)
    except TemplateError as e:
        print(f"[cfn_template] error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
