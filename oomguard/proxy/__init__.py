"""`oomguard proxy`: an OpenAI-compatible gateway with KV-aware admission control.

The admission rule is a pure core (`admission.AdmissionController`); `server.ProxyServer` is the HTTP shell
around it; `command.running_proxy` starts one in the current event loop.
"""

from .admission import AdmissionController, Decision, Limits, Priority, Rejection, State, Ticket

__all__ = ["AdmissionController", "Decision", "Limits", "Priority", "Rejection", "State", "Ticket"]
