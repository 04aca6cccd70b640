"""The judge: runs only dataset code (the problem's prompt, its test, ``check``) and alone decides the verdict.

Run as ``python -I -c <wire.py + this file>`` (:func:`validate.sandbox.program`) on the base interpreter, the
engine's user, with its own rlimits, a wall-clock alarm and not dumpable. The candidate is :func:`candidate`, a
proxy that sends each call's arguments to the sandbox and returns the decoded result (or raises the decoded
exception). It writes a "setup" and a "done" event, each line prefixed with a nonce the sandbox never sees, on a
verdict pipe the sandbox never holds. A sandbox that ends, closes its pipe or breaks the protocol makes the run
"error" (or "infra" before its setup finished), never "passed".

Self-contained (stdlib only, no ``from __future__``): the project cannot be imported on the base interpreter.
"""
import builtins
import json
import os
import resource
import signal
import sys
import traceback

if "write_frame" not in globals():  # imported as a module (tests, tools): in the judge wire.py's source precedes
    from validate.sandbox.wire import ProtocolError, decode, encode, read_frame, write_frame

# The run's pipes and nonce, and the test's lines (for messages); set by main() from the configuration.
VERDICT, CALLS, RESULTS, NONCE = -1, -1, -1, ""
TEST_LINES = []
fault = None  # the first SandboxFault: once the sandbox broke the protocol every later call raises it again
calls = 0


def emit(**message):
    """Write one event on the verdict pipe, nonce first."""
    os.write(VERDICT, (NONCE + json.dumps(message) + "\n").encode())


def finish(status, phase, detail="", fault=None):
    """Write the verdict and exit: nothing after it can change it."""
    emit(event="done", status=status, phase=phase, detail=str(detail)[:400], fault=fault)
    os._exit(0)


class SandboxFault(BaseException):
    """The sandbox ended, closed its pipe or broke the protocol: the run cannot pass."""

    def __init__(self, kind, detail):
        super().__init__(detail)
        self.kind, self.detail = kind, detail


class JudgeFault(BaseException):
    """The judge cannot do its part (an argument it cannot send): infra, never a verdict."""


class JudgeTimeout(BaseException):
    """The judge's wall-clock alarm (a BaseException: the test code's ``except Exception`` cannot swallow it)."""


class CandidateError(Exception):
    """An exception the candidate raised whose type is not a builtin exception: its name and message."""


def on_alarm(signum, frame):
    """SIGALRM handler: the wall-clock limit."""
    raise JudgeTimeout()


def harden(cfg):
    """Not dumpable, killed with the engine, rlimits of ``cfg``, the wall-clock alarm."""
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no ptrace, no /proc/<pid>/fd for same-uid processes
        libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG SIGKILL: gone with the engine
    except Exception:
        pass
    for res, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_AS, cfg["memory"]),
                       (resource.RLIMIT_CPU, cfg["cpu_s"]), (resource.RLIMIT_FSIZE, 1 << 20)):
        try:
            resource.setrlimit(res, (value, value))
        except (ValueError, OSError):
            pass
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(cfg["wall_s"])


def receive(during):
    """The sandbox's next message (a JSON object); raises the run's SandboxFault when there is none."""
    global fault
    if fault is None:
        try:
            message = read_frame(RESULTS)
            if type(message) is not dict:
                raise ProtocolError("a message that is not an object")
            return message
        except EOFError:
            fault = SandboxFault("ended", "the sandbox ended " + during)
        except (ProtocolError, OSError, MemoryError) as e:
            fault = SandboxFault("malformed", "the sandbox sent malformed data %s: %s" % (during, str(e)[:200]))
    raise fault


def malformed(why):
    """Record (and return, to raise) the run's fault: the sandbox broke the protocol."""
    global fault
    fault = SandboxFault("malformed", why)
    return fault


def rebuild(name, message):
    """The exception the candidate raised, rebuilt: the builtin exception type of that name, else CandidateError."""
    cls = getattr(builtins, name, None) if name.isidentifier() else None
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except Exception:
            pass
    return CandidateError(name + (": " + message if message else ""))


def candidate(*args, **kwargs):
    """The entry point as the test calls it: one call into the sandbox, its result decoded."""
    global calls, fault
    if fault is not None:
        raise fault
    try:
        request = {"seq": calls + 1, "args": encode(list(args), strict=True), "kwargs": encode(kwargs, strict=True)}
    except (TypeError, ValueError) as e:
        raise JudgeFault("call %d: an argument cannot be sent to the sandbox (%s)" % (calls + 1, e))
    calls += 1
    try:
        write_frame(CALLS, request)
    except ValueError as e:
        raise JudgeFault("call %d: %s" % (calls, e))
    except OSError:
        fault = SandboxFault("ended", "the sandbox ended before call %d" % calls)
        raise fault
    reply = receive("during call %d" % calls)
    if type(reply.get("seq")) is not int or reply["seq"] != calls or set(reply) not in ({"seq", "value"},
                                                                                        {"seq", "raised"}):
        raise malformed("the sandbox's reply to call %d is not one (seq %r)" % (calls, str(reply.get("seq"))[:20]))
    if "value" in reply:
        try:
            return decode(reply["value"])
        except (ProtocolError, RecursionError, MemoryError) as e:
            raise malformed("the sandbox's reply to call %d: %s" % (calls, str(e)[:200]))
    exc = reply["raised"]
    if type(exc) is not list or len(exc) != 2 or type(exc[0]) is not str or type(exc[1]) is not str:
        raise malformed("the sandbox's exception for call %d is not a [name, message] pair" % calls)
    raise rebuild(exc[0][:100], exc[1][:300])


def describe(e):
    """An exception of the test as the verdict names it: type, message and the test line it came from."""
    try:
        text = str(e)[:300]
    except Exception:
        text = ""
    out = type(e).__name__ + (": " + text if text else "")
    line = None
    for frame, lineno in traceback.walk_tb(e.__traceback__):
        if frame.f_code.co_filename == "<test>":
            line = lineno
    if line is not None and 0 < line <= len(TEST_LINES):
        out += " (test line %d: %s)" % (line, TEST_LINES[line - 1].strip()[:120])
    return out


def main():
    """The judge process: configuration from stdin, the sandbox's setup, the problem's code, ``check``, verdict."""
    global VERDICT, CALLS, RESULTS, NONCE, TEST_LINES
    cfg = json.loads(sys.stdin.buffer.read())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    VERDICT, CALLS, RESULTS, NONCE = cfg["verdict_fd"], cfg["call_fd"], cfg["result_fd"], cfg.pop("nonce")
    TEST_LINES = cfg["test"].splitlines()
    harden(cfg)

    phase = "setup"
    try:
        setup = receive("before its setup finished")
        if setup.get("event") != "setup":
            raise malformed("the sandbox's first message is not its setup")
        emit(event="setup", contained=[str(c)[:300] for c in setup.get("contained", ())][:20],
             not_contained=[str(c)[:300] for c in setup.get("not_contained", ())][:20])
        if setup.get("ok") is not True:
            finish("infra", "setup", "sandbox setup failed: %s" % str(setup.get("detail"))[:300])
        phase = "program"
        ready = receive("while the program was loading")
        exc = ready.get("raised")
        if ready.get("event") == "load" and type(exc) is list and len(exc) == 2 and all(type(s) is str for s in exc):
            finish("error", "program", exc[0][:100] + (": " + exc[1][:300] if exc[1] else ""))
        if ready != {"event": "ready"}:
            raise malformed("the sandbox's second message is neither ready nor a load error")
    except SandboxFault as f:
        finish("infra" if phase == "setup" else "error", phase, f.detail, f.kind)
    except JudgeTimeout:
        finish("timeout", phase, "the judge's wall-clock limit")

    phase = "test code"
    g = {"__name__": "__judge__", "__builtins__": builtins}
    try:
        exec(compile(cfg["prompt"], "<prompt>", "exec"), g)
        g[cfg["entry_point"]] = candidate  # the prompt's helpers call the candidate, as in the original harness
        exec(compile(cfg["test"], "<test>", "exec"), g)
        check = g["check"]
    except JudgeTimeout:
        finish("timeout", phase, "the judge's wall-clock limit")
    except BaseException as e:
        finish("infra", phase, "the problem's own code failed in the judge: " + describe(e))

    phase = "check"
    try:
        check(candidate)
    except JudgeTimeout:
        finish("timeout", phase, "the judge's wall-clock limit")
    except JudgeFault as e:
        finish("infra", phase, str(e))
    except SandboxFault:
        pass
    except AssertionError as e:
        if fault is None:
            finish("failed", phase, describe(e))
    except BaseException as e:
        if fault is None:
            finish("error", phase, describe(e))
    if fault is not None:  # even when the test code swallowed it
        finish("error", phase, fault.detail, fault.kind)
    finish("passed", phase)


if __name__ == "__main__":
    main()
