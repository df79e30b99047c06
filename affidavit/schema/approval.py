"""The ``approval`` setting of a target: which of its actions wait for a human, for how long.

Seed, "Validation and credential injection finish before dispatch": "a denied approval" stops a
call in ``credential_injection`` with nothing sent, and "Before approval, bind the normalized
target, the credential version, the resolved injection method, and the request fingerprint to
the invocation".  The setting only says *which* actions need a yes; the engine binds and
re-checks (``affidavit.engine.approval``), operators decide (``affidavit.approvals``).

    approval = "always"
    approval = { methods = ["POST", "DELETE"], ttl = "15m", wait = "0s" }     # HTTP
    approval = { commands = ["^deploy ", "rm "], ttl = "1h", wait = "30s" }    # SSH
    approval = { except_commands = ["uptime", "systemctl status [a-z.-]+"] }  # SSH

A table without ``methods``/``commands``/``except_commands`` covers every action.  SSH command
patterns vouch only for a simple command without stdin (``ApprovalPolicy.command_reason``):
``commands`` lists what waits (anything not simple waits too), ``except_commands`` -- the
robust form -- what skips the wait (``re.fullmatch``; everything else waits).

``ttl``: how long a request stays approvable and an approval dispatchable, from the request;
``wait``: how long the caller waits for the decision before it is answered APPROVAL_PENDING.
The policy is part of the target's snapshot, so changing it invalidates every approval given
under the old one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from affidavit.bounds import MAX_TTL

from .fields import Field, Read, Schema
from .section import Section, kind_of
from .target import canonical_value
from .values import duration_setting

__all__ = ["MAX_TTL", "RUNNERS", "ApprovalPolicy", "approval_field", "not_simple", "runner"]

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
DEFAULT_TTL = "15m"
MAX_PATTERN = 1024

_SAFE = r"A-Za-z0-9_./:,@%+\-"
SIMPLE_COMMAND = re.compile(rf"[{_SAFE}]+(?: [{_SAFE}=]+)*")
"""A *simple* command: words of letters, digits and ``_./:,@%+-`` (``=`` too, after the first
word) separated by single spaces.  No quoting, expansion, redirection, separator, glob, tab or
non-ASCII character: what the shell runs is the words as written, so a pattern sees the
command the remote will run -- the only kind of command a pattern list can vouch for."""
RUNNERS = frozenset(
    {
        # Shells and their multi-call hosts: the rest of the line, a file or stdin is a script.
        *("ash", "bash", "busybox", "csh", "dash", "fish", "ksh", "mksh", "rbash", "sh", "tcsh"),
        *("toybox", "yash", "zsh"),
        # Shell builtins and keywords that run a command or code given as their words: `jobs -x
        # cmd`, `coproc cmd`, `trap cmd EXIT`, `fc -s` (history), `enable -f lib.so` (loads
        # code), `mapfile -C cmd`, zsh's precommand modifiers (`noglob cmd`, `- cmd`), `repeat 1
        # cmd`, `sched`, `emulate sh -c cmd`.
        *("-", ".", "builtin", "command", "coproc", "emulate", "enable", "eval", "exec", "fc"),
        *("jobs", "mapfile", "nocorrect", "noglob", "readarray", "repeat", "sched", "source"),
        *("time", "trap"),
        # Interpreters: code from their arguments, a file or stdin (``python*``/``pypy*`` and
        # versioned names like ``perl5.36.0``, ``lua5.4`` count too: ``runner``).
        *("awk", "bun", "clisp", "dc", "deno", "elixir", "erl", "escript", "expect", "gawk"),
        *("ghci", "groovy", "guile", "irb", "java", "jshell", "julia", "lua", "luajit", "mawk"),
        *("nawk", "node", "nodejs", "ocaml", "perl", "php", "pwsh", "r", "racket", "rscript"),
        *("ruby", "runghc", "runhaskell", "sbcl", "scala", "swipl", "tclsh", "wish"),
        # Wrappers that run the program named in their arguments, as another user, in another
        # namespace, personality, scheduling class or with limits, traced or under a loader.
        # The dynamic loader (``ld.so``) is every name ``runner`` takes for it.
        *("bwrap", "capsh", "cgexec", "chroot", "chrt", "doas", "eatmydata", "env", "fakeroot"),
        *("faketime", "firejail", "flock", "gdb", "i386", "ionice", "ld.so", "ldd", "linux32"),
        *("linux64", "ltrace", "nice", "nohup", "nsenter", "numactl", "perf", "pkexec"),
        *("prlimit", "run0", "runcon", "runuser", "script", "setarch", "setpriv", "setsid"),
        *("sg", "ssh-agent", "stdbuf", "strace", "su", "sudo", "systemd-cat", "systemd-inhibit"),
        *("systemd-nspawn", "systemd-run", "systemd-socket-activate", "taskset", "timeout"),
        *("unbuffer", "unshare", "valgrind", "watch", "x86_64"),
        # Schedulers, multiplexers, daemon starters and runners of many: commands run now or
        # later, detached.
        *("at", "batch", "crontab", "parallel", "run-parts", "screen", "start-stop-daemon"),
        *("tmux", "xargs"),
        # Tools whose options run a program or code: find -exec, sed's `e` (GNU: a shell), make
        # (recipes), git (aliases, -c core.pager=, core.sshCommand=), vim's family (-c, -S, -u:
        # Ex commands run programs), ed (commands from stdin, `!`), emacs (-l, --eval), tar
        # (--to-command, --checkpoint-action=exec=, -I), rsync (-e, --rsync-path), scp/sftp
        # (-S), ssh (the remote command, ProxyCommand), zip (-TT), man (-P, the pager), socat
        # (EXEC:), nc/ncat (-e, -c), ip (netns exec), apt/apt-get/dpkg (hook options), pip/npm
        # /npx (a package's build and scripts).  Not listed: less and more (commands only from
        # a terminal, which an exec has not), unzip (no option runs a program).
        *("apt", "apt-get", "dpkg", "ed", "emacs", "ex", "find", "git", "ip", "make", "man"),
        *("nc", "ncat", "netcat", "npm", "npx", "nvim", "pip", "rsync", "scp", "sed", "sftp"),
        *("socat", "ssh", "tar", "vi", "view", "vim", "zip"),
    }
)
"""First words that run other commands or code, as ``runner`` compares them (lower case,
without directory, Debian suffix or version): what they run is not the command line the
patterns see, so a ``commands`` policy sends them to an operator.  A name is here only when its
arguments or stdin can make it run another program or code.  No such list is complete -- a
program the broker has never heard of can run another -- which is why ``except_commands`` is
the robust form (docs/approvals.md)."""

_LOADER = re.compile(r"ld(?:64)?[-.]")
"""The dynamic loader by any of its names: ``ld-linux-x86-64.so.2``, ``ld-2.31.so``,
``ld64.so.2``, ``ld-linux-x32.so.2``, ``ld-musl-x86_64.so.1``, ``ld.so`` (``re.match``: at the
start; ``ld`` itself is the linker, ``ldd`` and ``ldconfig`` other programs)."""
_MULTIARCH = re.compile(r"-[a-z0-9_]+-linux-gnu[a-z0-9_]*\Z")
"""Debian's multiarch suffix (``perl5.36-x86_64-linux-gnu``, ``-arm-linux-gnueabihf``)."""
_ALTERNATIVE = re.compile(r"\.[a-z][a-z0-9]*\Z")
"""Debian's suffix for one of a program's alternatives or diversions: ``vim.basic``,
``vim.tiny``, ``sh.distrib``.  Neither pattern can cross a ``-`` or ``.`` it starts at, so a
search is linear in the name."""
_VERSION = re.compile(r"(?:[a-z]?[0-9.]*[0-9][-_.]?)+")
"""Version suffixes of a program's name, matched at the start of the name reversed
(``0.63.5lrep``): ``perl5.36.0``, ``python3.11``, ``lua5.4``, ``node18``, ``tclsh8.6``,
``gawk-5.1.0``.  Reversed, ``re.match`` takes the greedy way and stops: a time linear in the
name (anchored at its end, a caller's long run of digits would make a forward search backtrack
without end)."""


def runner(word: str) -> str | None:
    """The ``RUNNERS`` name (or ``python``/``pypy``) that the command word ``word`` is, or None:
    compared without its directory, in lower case, as written, then without a multiarch suffix,
    an alternatives suffix and a version in turn (``/usr/bin/Perl5.36-x86_64-linux-gnu`` ->
    ``perl``, ``vim.tiny`` -> ``vim``); any name of the loader is ``ld.so``."""
    name = word.rsplit("/", 1)[-1].lower()
    if _LOADER.match(name):
        return "ld.so"
    stem = _MULTIARCH.sub("", name)
    stem = _ALTERNATIVE.sub("", stem)
    version = _VERSION.match(stem[::-1])
    candidates = (name, stem, stem[: len(stem) - version.end()] if version else stem)
    for candidate in candidates:
        if candidate in RUNNERS:
            return candidate
        if candidate.startswith(("python", "pypy")):
            return candidate[:4] if candidate.startswith("pypy") else "python"
    return None


def not_simple(command: str) -> str | None:
    """Why ``command`` is not a simple command (``SIMPLE_COMMAND``), or None when it is."""
    if SIMPLE_COMMAND.fullmatch(command):
        return None
    first = command.split(" ", 1)[0]
    if "=" in first and SIMPLE_COMMAND.fullmatch(command.replace("=", "_")):
        return "not a simple command (it starts with a variable assignment)"
    bad = next((c for c in command if not re.fullmatch(rf"[{_SAFE}= ]", c)), None)
    if bad is not None:
        return f"not a simple command (it holds {bad!a})"
    return "not a simple command (a leading, trailing or double space)"


def _name(command: str) -> str:
    """The command's first word without its directory (``/usr/bin/sudo`` -> ``sudo``)."""
    return command.split(" ", 1)[0].rsplit("/", 1)[-1]


@dataclass(frozen=True)
class ApprovalPolicy:
    methods: frozenset[str] | None
    """HTTP methods that need a yes (upper case); None: not a selector of this policy."""
    commands: tuple[str, ...] | None
    """Regular expressions (``re.search``, anywhere in the command) of SSH commands that need
    a yes; None: not a selector of this policy.  They vouch only for a simple command without
    stdin (``command_reason``)."""
    ttl: float
    wait: float
    except_commands: tuple[str, ...] | None = None
    """Regular expressions (``re.fullmatch``, the whole command) of the simple SSH commands
    without stdin that need no yes -- every other command needs one; None: not a selector."""

    @property
    def always(self) -> bool:
        return self.methods is None and self.commands is None and self.except_commands is None

    @property
    def caveat(self) -> str | None:
        """Why this policy is no security boundary (for the operator's log), or None: a
        ``commands`` list names what waits, and no such list is complete against a hostile
        caller."""
        if self.commands is None:
            return None
        return (
            "commands lists what waits for an operator, and no such list is complete against "
            "a hostile caller (a program it does not name can run the one it guards); for a "
            'security boundary list what skips the wait (except_commands) or use "always" '
            "(docs/approvals.md)"
        )

    def requires(
        self, *, method: str | None = None, command: str | None = None, stdin: bool = False
    ) -> bool:
        """Whether an action with this method or command (and stdin) needs a human's yes."""
        if self.always:
            return True
        if self.methods is not None and method is not None and method.upper() in self.methods:
            return True
        return command is not None and self.command_reason(command, stdin=stdin) is not None

    def command_reason(self, command: str, *, stdin: bool = False) -> str | None:
        """Why an SSH command needs a yes, or None when it needs none.  A pattern list fails
        closed: it vouches only for a simple command (``SIMPLE_COMMAND``) without stdin whose
        first word does not run other code (``runner``); any other command waits for a yes.
        A simple command waits when a pattern matches it -- or, named by its path
        (``/opt/bin/deploy x``), matches it named without (``deploy x``)."""
        if self.always:
            return "every action of this target needs approval"
        if self.commands is None and self.except_commands is None:
            return None
        if stdin:
            return "it has stdin, which no pattern sees"
        why = not_simple(command)
        if why is not None:
            return why
        if self.except_commands is not None:
            if any(re.fullmatch(p, command) for p in self.except_commands):
                return None
            return "it is not listed in except_commands"
        assert self.commands is not None
        name = _name(command)
        if runner(name) is not None:
            return f"{name!r} runs other commands or code"
        bare = name + command[len(command.split(" ", 1)[0]) :]
        for i, pattern in enumerate(self.commands):
            if re.search(pattern, command) or re.search(pattern, bare):
                return f"it matches commands[{i}] ({pattern})"
        return None


def _methods(r: Read) -> frozenset[str] | None:
    if not r.present:
        return None
    items = r.string_list()
    if not items:
        raise r.error("must list at least one method (or leave the key out: every action)")
    for i, m in enumerate(items):
        if not _TOKEN.fullmatch(m):
            raise r.error("is not an HTTP method token", f"[{i}]")
    return frozenset(m.upper() for m in items)


def _except_commands(r: Read) -> tuple[str, ...] | None:
    if r.present and r.values.get("commands") is not None:
        raise r.error("cannot be given with commands: list what waits, or what does not")
    return _commands(r)


def _commands(r: Read) -> tuple[str, ...] | None:
    if not r.present:
        return None
    items = r.string_list()
    if not items:
        raise r.error("must list at least one pattern (or leave the key out: every action)")
    for i, pattern in enumerate(items):
        if len(pattern) > MAX_PATTERN:
            raise r.error(f"is longer than {MAX_PATTERN} characters", f"[{i}]")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise r.error(f"is not a regular expression ({exc.msg})", f"[{i}]") from None
        except (RecursionError, OverflowError):  # nesting too deep for the parser
            raise r.error("is not a regular expression this broker can compile", f"[{i}]") from None
    return tuple(items)


def _ttl(r: Read) -> float:
    ttl = duration_setting(r)
    if ttl > MAX_TTL:
        raise r.error("must be at most 7 days")
    return ttl


def _wait(r: Read) -> float:
    wait = duration_setting(r, zero=True)
    if wait > r.values["ttl"]:
        raise r.error("must not exceed ttl: the request would expire while the caller waits")
    return wait


def _schema(selector: str) -> Schema[ApprovalPolicy]:
    """The table form, with only the protocol's own selector key (``methods`` or ``commands``);
    the other is implied None (an unknown key in that protocol's table)."""
    select = Field(
        selector,
        _methods if selector == "methods" else _commands,
        default=None,
        doc="HTTP methods that need a yes (default: every action)"
        if selector == "methods"
        else "regular expressions (searched anywhere in the command) of simple commands that "
        "need a yes; a command that is not simple, has stdin or runs other code always needs "
        "one (default: every action)",
    )
    other = "commands" if selector == "methods" else "methods"
    exempt = (
        Field(
            "except_commands",
            _except_commands,
            default=None,
            doc="regular expressions (matching the whole command) of the simple commands "
            "without stdin that need no yes; every other command needs one",
        )
        if selector == "commands"
        else Field("except_commands", lambda r: None, key=None)
    )
    return Schema(
        ApprovalPolicy,
        (
            select,
            Field(other, lambda r: None, key=None),
            exempt,
            Field("ttl", _ttl, default=DEFAULT_TTL, doc="how long the request stays approvable"),
            Field("wait", _wait, default="0s", doc="how long the caller waits for the decision"),
        ),
    )


def _snapshot(policy: ApprovalPolicy | None) -> Any:
    """The policy as a snapshot binds it; without ``except_commands`` as before that key
    existed, so the hash of a target that does not use it did not move."""
    out = canonical_value(policy)
    if isinstance(out, dict) and out.get("except_commands") is None:
        del out["except_commands"]
    return out


def approval_field(selector: str) -> Field:
    """A protocol's ``approval`` setting; ``selector`` is its own key: ``methods`` (HTTP) or
    ``commands`` (SSH, which also takes ``except_commands``).  Absent: no action needs approval
    (and the snapshot is unchanged)."""
    if selector not in ("methods", "commands"):
        raise ValueError(f"no approval selector {selector!r}")
    schema = _schema(selector)
    forms = f'`"always"` or `{{ {selector}, ttl, wait }}`'
    if selector == "commands":
        forms = '`"always"`, `{ commands, ttl, wait }` or `{ except_commands, ttl, wait }`'

    def parse(r: Read) -> ApprovalPolicy | None:
        if not r.present:
            return None
        raw: Any = r.raw()
        if raw == "always":
            return schema.read(Section({}, r.path), r.context)
        if not isinstance(raw, dict):
            raise r.error(f'must be "always" or a table, not {kind_of(raw)}')
        return schema.parse_table(r)

    return Field(
        "approval",
        parse,
        default=None,
        unset_omitted=True,
        shown="none",
        encode=_snapshot,
        doc=f"{forms}: actions that wait for an operator's yes (see [approvals](approvals.md))",
    )
