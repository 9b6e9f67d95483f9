"""Adaptive data-reduction policies: which codec level to send this step (docs/POLICIES.md).

Every policy is a small synchronous state machine behind one interface (`base.Policy`): `choose`
takes a `ChooseRequest` (the link snapshot, the dense payload size, the measured compute time, the
step) and returns a `Decision`; `observe` takes a `SendReport` of what the send really cost. No
clocks are read here (time arrives in `LinkState.time_s` or as an argument), so policies run on
synthetic sequences in tests. Policies register by name like codecs do (`registry`); importing this package registers
every one of them.

Where things are: the policy's input `link.LinkState`, the level ladder `ladder`, the request, the
decision and the step-time model `decision`, the decision log `decisionlog`, measured costs
`costs`, the per-level progress estimate `progress`, the per-direction bookkeeping the uplink and
downlink share `loop`; one module per policy (`fixed`, `dc2`, `paper`, `accordion`, `gravac`,
`netsense`), the netsense policy's parts in `netsense_settings`, `law`, `probes` and `bandwidth`.
"""

from __future__ import annotations

# Each policy module registers its policies on import.
from .accordion import AccordionPolicy, AccordionSettings
from .base import Policy
from .dc2 import Dc2Policy, Dc2Settings
from .decision import ChooseRequest, Decision, Prediction, SendReport, predict
from .fixed import FixedPolicy
from .gravac import GravacPolicy, GravacSettings
from .netsense import NetsensePolicy
from .netsense_settings import NetsensePolicySettings
from .paper import PaperPolicy, PaperPolicySettings
from .registry import PolicyFactory, build_policy, make_policy, policy_names, register_policy

__all__ = [
    "AccordionPolicy",
    "AccordionSettings",
    "ChooseRequest",
    "Dc2Policy",
    "Dc2Settings",
    "Decision",
    "FixedPolicy",
    "GravacPolicy",
    "GravacSettings",
    "NetsensePolicy",
    "NetsensePolicySettings",
    "PaperPolicy",
    "PaperPolicySettings",
    "Policy",
    "PolicyFactory",
    "Prediction",
    "SendReport",
    "build_policy",
    "make_policy",
    "policy_names",
    "predict",
    "register_policy",
]
