"""A ValidatingAdmissionPolicy's CEL run as the API server runs it: its variables in order (each sees those
before it), then its validations, each refusal with its message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cel

Obj = dict[str, Any]
Run = Callable[[str, Any], Any]


def run_cel(expression: str, context: Any) -> Any:
    return cel.compile(expression).execute(context)


def refusals_in(context: Any, spec: Obj, run: Run = run_cel) -> list[str]:
    """The messages of the validations of `spec` that do not hold in `context` (which has the policy's
    `object`, `params`, ... already): a validation's `messageExpression` evaluated where it has one (the
    API server prefers it), else its `message`."""
    variables: Obj = {}
    for variable in spec["variables"]:
        context.add_variable("variables", variables)
        variables[variable["name"]] = run(variable["expression"], context)
    context.add_variable("variables", variables)
    return [
        str(run(v["messageExpression"], context)) if "messageExpression" in v else v["message"]
        for v in spec["validations"]
        if run(v["expression"], context) is not True
    ]
