"""The claim admission policy: refuses, when a claim is created, what the node would refuse after binding.

A ResourceClaim (or template) is checked by a ValidatingAdmissionPolicy built from the same class list
as the DeviceClasses, so that no claim is bound to a GPU and then fails `NodePrepareResources`
forever. Each rule is one validation whose message says what to change:

- a request of a shared class names both capacities (`memory` and `cores`) or neither: one that is
  left out is charged in full (the request policy's default is the whole GPU), so the GPU would
  have no room left for other shares;
- a request of one of the driver's classes names capacities as the devices publish them, unqualified
  (`memory`, not `gpu.dra-gpu.io/memory`): the 1.34-1.37 scheduler (and the in-tree allocator there) look
  a requested name up verbatim in the device's capacity, so a qualified name is never allocated. Where the
  install's `kubernetesMinVersion` is 1.38 or newer, whose scheduler resolves `<driver>/<name>` to the
  device's `<name>` (kubernetes/kubernetes PR #142202), the driver's own domain is accepted and every
  rule here reads `gpu.dra-gpu.io/memory` as `memory`; another domain (never resolved to our devices) and
  both forms of one name in a request (which one the scheduler charges is not defined) stay refused;
- a claim's GpuConfig keeps its class's sharing strategy: the class selects GPUs of the mode that
  strategy needs, and another strategy on them (MPS beside Limiter shares, Exclusive beside shares)
  is refused by the node;
- a claim's GpuConfig does not pick its own time-slice interval: the interval is GPU-wide, set for
  every time-sliced claim by the timeslice class, so two claims on one GPU never disagree;
- a claim with an MPS request has only that request, for one GPU: a CUDA process connects to one
  MPS control daemon, which serves one GPU;
- a claim's `sharing.limiter.memoryLimit` is at least the memory its request will consume (the request
  rounded up to the capacity's step, as the scheduler rounds it): the limit is the ceiling above the
  guaranteed share;
- a claim's `sharing.limiter.compute.limit` is at least the claim's `cores` (in the config and in each
  request it applies to: the floor; a request naming no cores asks for all 100), or the node would drop it;
- a claim's config of this driver is a well-formed GpuConfig: one check per object of its JSON Schema,
  generated from the schema (`config_shape.py`), so that the model, the schema, this policy and the node accept
  the same shapes; the other rules read only the well-formed configs (`variables.gpuConfigs`), so that no
  shape (a null, a string where a number goes) makes their CEL fail instead of the shape's own message;
- a claim asks for no more priority, compute ceiling or memory ceiling than its class grants: a second
  policy with the DeviceClasses as params (`grant_policy`, config/grants.py).

The policy judges a claim when it is created only: a claim's (and a template's) spec is immutable, and
judging it again on a metadata update (a finalizer added or removed) would deny that update for a claim
created before the policy or before a rule was tightened, which then could never be deleted.

The expressions avoid CEL's optional syntax so that the tests can run them with the `cel` package.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from dra_gpu import DRIVER_NAME
from dra_gpu.config import Priority, Strategy
from dra_gpu.config.grants import RANK
from dra_gpu.config.modes import mode_named, takes_whole_gpu
from dra_gpu.limiter_abi.limits import PRIORITY_ORDER
from dra_gpu.manifests.capacity_names import (
    QUALIFIED_138_MESSAGE,
    QUALIFIED_MESSAGE,
    amount,
    in_requests,
    resolves_qualified_names,
    unqualified,
)
from dra_gpu.manifests.classes import CLASSES
from dra_gpu.manifests.config_shape import gpu_configs_variable, shape_validations
from dra_gpu.manifests.values import Values
from dra_gpu.vocabulary.device import MEMORY_STEP

Obj = dict[str, Any]

CAPACITY_MESSAGE = (
    'a request for a GPU share names only one of the capacities "memory" and "cores": name both, e.g. '
    "capacity: {requests: {memory: 10Gi, cores: 25}}, or neither for the whole GPU; a capacity left out "
    "is charged in full, which leaves no room on the GPU for other claims"
)
STRATEGY_MESSAGE = (
    f"a {DRIVER_NAME} GpuConfig in the claim sets sharing.strategy other than the strategy of the device "
    f"class of a request it applies to; choose the strategy with the device class (the class selects GPUs "
    f"that can host it) and keep the claim's sharing.strategy equal to the class's, or leave it out"
)

MPS_MESSAGE = (
    "a claim with a request of an MPS class must have only that request, for one GPU (count 1): a CUDA "
    "process connects to one MPS control daemon, which serves one GPU; put other GPUs in claims of their own"
)

LIMIT_MESSAGE = (
    f"a {DRIVER_NAME} GpuConfig in the claim sets sharing.limiter.memoryLimit below the memory a request it "
    f"applies to asks for (rounded up to a multiple of {MEMORY_STEP >> 20}Mi, as the scheduler rounds it); the "
    f"limit is the ceiling above the guaranteed share: raise memoryLimit or request less memory"
)

COMPUTE_FLOOR_MESSAGE = (
    f"a {DRIVER_NAME} GpuConfig in the claim sets sharing.limiter.compute.limit below the cores its claim "
    f"asks for (sharing.limiter.cores or a request's capacity cores it applies to); cores is the guaranteed "
    f"floor (a request that names no cores asks for all 100) and the limit the ceiling above it: raise "
    f"compute.limit, ask for fewer cores, or leave compute.limit out"
)

PRIORITY_GRANT_MESSAGE = (
    f"a {DRIVER_NAME} GpuConfig in the claim asks for a sharing.limiter.compute.priority above what its "
    f"DeviceClass grants ({PRIORITY_ORDER}): ask for less, or use a class that grants more"
)
LIMIT_GRANT_MESSAGE = (
    f"a {DRIVER_NAME} GpuConfig in the claim asks for a sharing.limiter.compute.limit above what its DeviceClass "
    f"grants (its compute.limit, else the cores the request asks for): ask for less, or use a class that grants more"
)
MEMORY_GRANT_MESSAGE = (
    f"a {DRIVER_NAME} GpuConfig in the claim asks for a sharing.limiter.memoryLimit above what its DeviceClass "
    f"grants (its memoryLimit, else the memory the request asks for): ask for less, or use a class that grants more"
)


def _compute_validations(qualified: bool = False) -> list[Obj]:
    """The rule on `sharing.limiter.compute` (elastic compute; its shape is checked with the rest): a ceiling
    no lower than the floor the claim asks for, or the node would drop it. A request that names no cores is
    charged all of them (100), unless the config names its `cores` (API servers without consumable capacity)."""
    limiter = "c.opaque.parameters.sharing.limiter"
    limit = f"int({limiter}.compute.limit)"
    has_limit = f"{_ours('c')} && has({limiter}) && has({limiter}.compute) && has({limiter}.compute.limit)"
    cores = (
        f"({_named('x', 'cores', qualified)}) ? quantity({amount('x', 'cores', qualified)}) : "
        f"quantity(string(has({limiter}.cores) ? int({limiter}.cores) : 100))"
    )
    above_floor = (
        f"variables.gpuConfigs.all(c, !({has_limit}) || ("
        f"(!has({limiter}.cores) || {limit} >= int({limiter}.cores)) && "
        f"variables.requests.all(r, !({_applies('c', 'r')}) || {_request_classes('r')}.all(x, "
        f"!({cores}).isGreaterThan(quantity(string({limit})))))))"
    )
    return [{"expression": above_floor, "message": COMPUTE_FLOOR_MESSAGE, "reason": "Invalid"}]


def _interval_message(interval: str) -> str:
    return (
        f"a {DRIVER_NAME} GpuConfig in the claim sets sharing.timeSlicing.interval; the interval is a "
        f"setting of the whole GPU, the same ({interval}) for every time-sliced claim: remove it from the "
        f"claim"
    )


def _literal(value: Any) -> str:
    return json.dumps(value)


def class_strategies(values: Values) -> dict[str, str]:
    """Every DeviceClass of the driver and the sharing strategy its GpuConfig sets."""
    strategies = {c.name: c.strategy.value for c in CLASSES}
    if values.controller.enabled:
        strategies.update({c.name: c.strategy.value for c in values.controller.classes})
    return strategies


def _request_classes(r: str) -> str:
    """The class names of request `r`: its `exactly` class or those of its `firstAvailable` list."""
    return f"(has({r}.exactly) ? [{r}.exactly] : (has({r}.firstAvailable) ? {r}.firstAvailable : []))"


def _capacity_ok(x: str, shared: list[str], qualified: bool) -> str:
    return (
        f"!({x}.deviceClassName in {_literal(shared)}) || !has({x}.capacity) || "
        f"!has({x}.capacity.requests) || {in_requests(x, 'memory', qualified)} == {in_requests(x, 'cores', qualified)}"
    )


def _ours(c: str) -> str:
    return f'has({c}.opaque) && {c}.opaque.driver == "{DRIVER_NAME}" && has({c}.opaque.parameters.sharing)'


def _applies(c: str, r: str) -> str:
    return (
        f"!has({c}.requests) || size({c}.requests) == 0 || {r}.name in {c}.requests || "
        f'{c}.requests.exists(n, n.startsWith({r}.name + "/"))'
    )


def validations(values: Values) -> list[Obj]:
    qualified = resolves_qualified_names(values)
    strategies = class_strategies(values)
    shared = sorted(n for n, s in strategies.items() if not takes_whole_gpu(s))
    interval = values.deviceClasses.timeSlicingInterval
    capacity = (
        f"variables.requests.all(r, {_request_classes('r')}.all(x, {_capacity_ok('x', shared, qualified)}))"
    )
    names = (
        f"variables.requests.all(r, {_request_classes('r')}.all(x, "
        f"{unqualified('x', sorted(strategies), qualified)}))"
    )
    strategy = (
        f"variables.gpuConfigs.all(c, variables.requests.all(r, !({_applies('c', 'r')}) || "
        f"{_request_classes('r')}.all(x, !(x.deviceClassName in variables.classStrategies) || "
        f"variables.classStrategies[x.deviceClassName] == (has(c.opaque.parameters.sharing) && "
        f"has(c.opaque.parameters.sharing.strategy) ? c.opaque.parameters.sharing.strategy : "
        f'"{Strategy.EXCLUSIVE.value}"))))'
    )
    timeslice = (
        f"variables.gpuConfigs.all(c, !({_ours('c')}) || !has(c.opaque.parameters.sharing.timeSlicing) || "
        f"!has(c.opaque.parameters.sharing.timeSlicing.interval) || "
        f"c.opaque.parameters.sharing.timeSlicing.interval == {_literal(interval)})"
    )
    mps_classes = sorted(
        n for n, s in strategies.items() if (m := mode_named(s)) is not None and m.one_device
    )
    mps = (
        f"!variables.requests.exists(r, {_request_classes('r')}.exists(x, x.deviceClassName in "
        f"{_literal(mps_classes)})) || (size(variables.requests) == 1 && variables.requests.all(r, "
        f'{_request_classes("r")}.all(x, (!has(x.allocationMode) || x.allocationMode == "ExactCount") && '
        f"(!has(x.count) || x.count == 1))))"
    )
    limit = "c.opaque.parameters.sharing.limiter.memoryLimit"
    step = MEMORY_STEP
    memory_limit = (
        f"variables.gpuConfigs.all(c, !({_ours('c')}) || !has(c.opaque.parameters.sharing.limiter) || "
        f"!has({limit}) || variables.requests.all(r, !({_applies('c', 'r')}) || {_request_classes('r')}.all(x, "
        f"!has(x.capacity) || !has(x.capacity.requests) || !{in_requests('x', 'memory', qualified)} || "
        f"quantity(string({limit})).asInteger() >= "
        f"(quantity({amount('x', 'memory', qualified)}).asInteger() + {step - 1}) / {step} * {step})))"
    )
    return [
        {"expression": capacity, "message": CAPACITY_MESSAGE, "reason": "Invalid"},
        {
            "expression": names,
            "message": QUALIFIED_138_MESSAGE if qualified else QUALIFIED_MESSAGE,
            "reason": "Invalid",
        },
        {"expression": strategy, "message": STRATEGY_MESSAGE, "reason": "Invalid"},
        {"expression": timeslice, "message": _interval_message(interval), "reason": "Invalid"},
        {"expression": mps, "message": MPS_MESSAGE, "reason": "Invalid"},
        {"expression": memory_limit, "message": LIMIT_MESSAGE, "reason": "Invalid"},
        *_compute_validations(qualified),
        *shape_validations(),
    ]


def variables(values: Values) -> list[Obj]:
    """The claim's spec (a template's too), its requests and configs, and the classes' strategies."""
    return [
        *_VARIABLES,
        gpu_configs_variable(),
        {"name": "classStrategies", "expression": _literal(class_strategies(values))},
    ]


_VARIABLES = [
    {
        "name": "spec",
        "expression": 'object.kind == "ResourceClaimTemplate" ? object.spec.spec : object.spec',
    },
    {
        "name": "requests",
        "expression": (
            "has(variables.spec.devices) && has(variables.spec.devices.requests) ? "
            "variables.spec.devices.requests : []"
        ),
    },
    {
        "name": "configs",
        "expression": (
            "has(variables.spec.devices) && has(variables.spec.devices.config) ? "
            "variables.spec.devices.config : []"
        ),
    },
]


_RANK = {p.value: rank for p, rank in RANK.items()}
_LIMITER = "c.opaque.parameters.sharing.limiter"


def _grant_variables() -> list[Obj]:
    """The claim's spec, requests and configs, and what the DeviceClass in `params` grants (config/grants.py)."""
    configs = "variables.classConfigs"
    last = f"{configs}[size({configs}) - 1].opaque.parameters.sharing"
    limiter = "variables.classLimiter"
    return [
        *_VARIABLES,
        gpu_configs_variable(),
        {
            "name": "classConfigs",
            "expression": (
                f"has(params.spec.config) ? params.spec.config.filter(g, has(g.opaque) && "
                f'g.opaque.driver == "{DRIVER_NAME}") : []'
            ),
        },
        {
            # A class selecting this driver's devices without a config of its own grants the defaults.
            "name": "classIsOurs",
            "expression": (
                f"size({configs}) > 0 || (has(params.spec.selectors) && params.spec.selectors.exists(s, "
                f"has(s.cel) && s.cel.expression.contains('\"{DRIVER_NAME}\"')))"
            ),
        },
        {
            "name": "classLimiter",
            "expression": f"size({configs}) > 0 && has({last}) && has({last}.limiter) ? {last}.limiter : {{}}",
        },
        {
            "name": "classStrategy",
            "expression": (
                f"size({configs}) > 0 && has({last}) && has({last}.strategy) ? string({last}.strategy) : "
                f'"{Strategy.EXCLUSIVE.value}"'
            ),
        },
        {
            "name": "classPriority",
            "expression": (
                f"has({limiter}.compute) && has({limiter}.compute.priority) && "
                f"string({limiter}.compute.priority) in {_literal(_RANK)} ? string({limiter}.compute.priority) : "
                f'"{Priority.STANDARD.value}"'
            ),
        },
        {
            "name": "classLimit",
            "expression": (
                f"has({limiter}.compute) && has({limiter}.compute.limit) && type({limiter}.compute.limit) == int "
                f"? {limiter}.compute.limit : 0"
            ),
        },
        {
            "name": "classMemoryLimit",
            "expression": (
                f"has({limiter}.memoryLimit) && isQuantity(string({limiter}.memoryLimit)) ? "
                f'string({limiter}.memoryLimit) : ""'
            ),
        },
    ]


def _per_class_request(rule: str) -> str:
    """`rule` holds for each claim config of this driver with a limiter section, on every request (and
    alternative) of the class in `params` that it applies to; `x` is the request, `c` the config."""
    return (
        f"!variables.classIsOurs || variables.gpuConfigs.all(c, !({_ours('c')}) || "
        f"!has({_LIMITER}) || variables.requests.all(r, !({_applies('c', 'r')}) || "
        f"{_request_classes('r')}.all(x, x.deviceClassName != params.metadata.name || ({rule}))))"
    )


def _named(x: str, capacity: str, qualified: bool = False) -> str:
    return f"has({x}.capacity) && has({x}.capacity.requests) && {in_requests(x, capacity, qualified)}"


def grant_validations(known: Iterable[str], qualified: bool = False) -> list[Obj]:
    """The rules of config/grants.py: a claim asks for no more priority, compute ceiling or memory ceiling
    than its class grants; and, for classes the claim policy does not know (`known`: an admin's own), a claim
    keeps its class's strategy. `qualified`: capacities may be named with the driver's domain (1.38+)."""
    compute, step = f"{_LIMITER}.compute", MEMORY_STEP
    priority = (
        f"!has({compute}) || !has({compute}.priority) || !({compute}.priority in {_literal(_RANK)}) || "
        f"{_literal(_RANK)}[{compute}.priority] <= {_literal(_RANK)}[variables.classPriority]"
    )
    limit = f"{compute}.limit"
    floor_ok = (
        f"({_named('x', 'cores', qualified)}) ? "
        f"!quantity(string(int({limit}))).isGreaterThan(quantity({amount('x', 'cores', qualified)})) "
        f": (!has({_LIMITER}.cores) || int({limit}) <= int({_LIMITER}.cores))"
    )
    ceiling = (
        f"!has({compute}) || !has({limit}) || "
        f"(variables.classLimit > 0 && int({limit}) <= variables.classLimit) || ({floor_ok})"
    )
    asked = f"quantity(string({_LIMITER}.memoryLimit))"
    charged = f"quantity(string((quantity({amount('x', 'memory', qualified)}).asInteger() + {step - 1}) / {step} * {step}))"
    memory = (
        f"!has({_LIMITER}.memoryLimit) || !isQuantity(string({_LIMITER}.memoryLimit)) || "
        f"!({_named('x', 'memory', qualified)}) || !isQuantity({amount('x', 'memory', qualified)}) || "
        f'(variables.classMemoryLimit != "" && !{asked}.isGreaterThan(quantity(variables.classMemoryLimit))) || '
        f"!{asked}.isGreaterThan({charged})"
    )
    name = '" + params.metadata.name + "'
    sharing = "c.opaque.parameters.sharing"
    strategy = (
        f"!variables.classIsOurs || size(variables.classConfigs) == 0 || params.metadata.name in "
        f"{_literal(sorted(known))} || variables.gpuConfigs.all(c, variables.requests.all(r, "
        f"!({_applies('c', 'r')}) || {_request_classes('r')}.all(x, x.deviceClassName != params.metadata.name || "
        f"variables.classStrategy == (has({sharing}) && has({sharing}.strategy) ? {sharing}.strategy : "
        f'"{Strategy.EXCLUSIVE.value}"))))'
    )
    return [
        {
            "expression": strategy,
            "message": STRATEGY_MESSAGE,
            "messageExpression": (
                f'"a {DRIVER_NAME} GpuConfig in the claim sets a sharing.strategy (Exclusive where left out) other '
                f'than " + variables.classStrategy + ", the strategy of its DeviceClass {name}: leave the claim\'s '
                f"sharing.strategy out or equal to the class's\""
            ),
            "reason": "Invalid",
        },
        {
            "expression": _per_class_request(priority),
            "message": PRIORITY_GRANT_MESSAGE,
            "messageExpression": (
                f'"a {DRIVER_NAME} GpuConfig in the claim asks for a sharing.limiter.compute.priority above '
                f'the " + variables.classPriority + " its DeviceClass {name} grants ({PRIORITY_ORDER}): ask for '
                f'" + variables.classPriority + " or lower, or use a class that grants more"'
            ),
            "reason": "Forbidden",
        },
        {
            "expression": _per_class_request(ceiling),
            "message": LIMIT_GRANT_MESSAGE,
            "messageExpression": (
                f'"a {DRIVER_NAME} GpuConfig in the claim asks for a sharing.limiter.compute.limit above what its '
                f'DeviceClass {name} grants (" + (variables.classLimit > 0 ? string(variables.classLimit) + '
                f'", or the cores the request asks for where higher" : "the cores the request asks for: the class '
                f'sets no compute.limit") + "): ask for less, or use a class that grants more"'
            ),
            "reason": "Forbidden",
        },
        {
            "expression": _per_class_request(memory),
            "message": MEMORY_GRANT_MESSAGE,
            "messageExpression": (
                f'"a {DRIVER_NAME} GpuConfig in the claim asks for a sharing.limiter.memoryLimit above what its '
                f'DeviceClass {name} grants (" + (variables.classMemoryLimit != "" ? variables.classMemoryLimit + '
                f'", or the memory the request asks for where more" : "the memory the request asks for: the class '
                f'sets no memoryLimit") + "): ask for less, or use a class that grants more"'
            ),
            "reason": "Forbidden",
        },
    ]


def grant_policy(values: Values, name: str, labels: dict[str, str]) -> list[Obj]:
    """The policy that holds a claim to what its DeviceClass grants, and its binding.

    A claim's policy cannot read a DeviceClass, so this one takes the classes as its params
    (`paramKind: DeviceClass`); its binding selects every DeviceClass (`selector: {}`), and the API server
    evaluates the policy once per class, each evaluation judging the requests of that class. With no class
    at all nothing can be allocated, so a missing param allows (`parameterNotFoundAction: Allow`).
    """
    return policy_and_binding(
        name,
        labels,
        {
            "paramKind": {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass"},
            "matchConstraints": _match_claims(),
            "variables": _grant_variables(),
            "validations": grant_validations(class_strategies(values), resolves_qualified_names(values)),
        },
        param_ref={"selector": {}, "parameterNotFoundAction": "Allow"},
    )


def policy_and_binding(
    name: str, labels: dict[str, str], spec: Obj, param_ref: Obj | None = None
) -> list[Obj]:
    """A ValidatingAdmissionPolicy `name` that fails closed (`failurePolicy: Fail`) with the rest of its
    `spec`, and the binding that enforces it (`Deny`), with `param_ref` where the policy takes params."""
    policy: Obj = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": labels},
        "spec": {"failurePolicy": "Fail", **spec},
    }
    binding: Obj = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "policyName": name,
            **({"paramRef": param_ref} if param_ref is not None else {}),
            "validationActions": ["Deny"],
        },
    }
    return [policy, binding]


def _match_claims() -> Obj:
    return {
        "matchPolicy": "Equivalent",
        "resourceRules": [
            {
                "apiGroups": ["resource.k8s.io"],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["resourceclaims", "resourceclaimtemplates"],
            }
        ],
    }


def claim_policy(values: Values, name: str, labels: dict[str, str]) -> list[Obj]:
    """The ValidatingAdmissionPolicy on ResourceClaims and ResourceClaimTemplates, and its binding; then
    the grant policy (`<name>-grants`) and its binding."""
    spec: Obj = {
        "matchConstraints": _match_claims(),
        "variables": variables(values),
        "validations": validations(values),
    }
    return [*policy_and_binding(name, labels, spec), *grant_policy(values, f"{name}-grants", labels)]
