"""r9k: custom kernels for vLLM, loaded through the ``vllm.general_plugins`` entry point.

vLLM calls :func:`register` in every process it starts (API server, engine core, workers). It installs the
op dispatch (each family after its bindings of :mod:`r9k.contract` hold against the running vLLM), then logs the
provenance line (which tree this is, which vLLM, which dispatch is installed in this process and which binding
failed; again, should a binding be refused once the model is built); every behaviour is behind a knob in :mod:`r9k.knobs`, whose stock values leave vLLM untouched.
"""
from __future__ import annotations

from r9k.version import __version__

__all__ = ["__version__", "register"]

_registered = False


def register() -> None:
    """Entry point for ``vllm.general_plugins``: install the op dispatch, then log provenance once per process.

    Idempotent: vLLM may call it more than once in one process.
    """
    global _registered
    if _registered:
        return
    _registered = True
    from r9k import contract, knobs, ops, provenance

    installed = ops.install()
    version = contract.vllm_version()
    if knobs.PROVENANCE_LOG():
        provenance.log_once(installed.names, installed.failed, version)

    def refused(failure: contract.Failure) -> None:
        # a binding found not to hold once the model is built (its family's dispatch already taken out): the
        # process prints its line again, without that family's names and with the failure
        fam_names = set(ops.FAMILIES.get(failure.family, ()))
        installed.names = [n for n in installed.names if n not in fam_names]
        installed.failed.append(failure.token())
        if knobs.PROVENANCE_LOG():
            provenance.log_once(installed.names, installed.failed, version)

    contract.on_refusal(refused)
