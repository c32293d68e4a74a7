"""Running a skill scenario: the sandbox, the agent run, activation detection, grading.

One run of one scenario is: a fresh sandbox (fixture copy, the whole catalog installed under
``.claude/skills/<id>``, ``git init`` and a commit, the scenario's ``setup``, an isolated HOME
holding only the login files), one headless ``claude -p`` run in it, then the verdict read from
the stream-json transcript and the sandbox's final state. See docs/skills.md.

Outcomes follow one rule: a run the provider did not finish (crash, timeout, an error result)
is an *error*, never a negative, and stays outside precision and recall; a ``forbid`` violation
fails the run even then.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pytest_evalloop.skills.rubric_judge import (
    SKILL_JUDGE_VERSION,
    InteractionVerdict,
    RubricReply,
    RubricRequest,
    SkillJudge,
    rubric_sha,
)
from pytest_evalloop.skills.scenarios import RubricRule, Scenario
from pytest_evalloop.skills.settings import SETTINGS_KEY as SKILLS_KEY
from pytest_evalloop.skills.settings import SKILL_JUDGE_KEY

if TYPE_CHECKING:
    from pytest_evalloop.skills.anthropic_agent import AnthropicSkillAgent

Mode = Literal["activation", "full"]
Preference = Literal["provider-default", "prefer", "minimize"]
ErrorKind = Literal["fixture", "sandbox", "setup", "provider", "isolation", "judge", "check"]

SKILLS_DIR = Path(".claude") / "skills"
MAX_TURNS: dict[str, int] = {"activation": 8, "full": 30}
PERMISSION_MODE: dict[str, str] = {"activation": "default", "full": "acceptEdits"}
READ_ONLY_DENIED = ("Edit", "Write", "MultiEdit", "NotebookEdit")
# Pre-approved in full mode so that "asked the user" measures real questions, not permission
# prompts for harmless inspection.
FULL_MODE_ALLOWED = (
    "Bash(git status:*)",
    "Bash(git diff:*)",
    "Bash(git log:*)",
    "Bash(npm test:*)",
    "Bash(node --test:*)",
    "Bash(pytest:*)",
)
SETUP_TIMEOUT_S = 120.0
KILL_GRACE_S = 5.0
DIFF_CHARS = 12_000
QUESTION_TOOLS = frozenset({"AskUserQuestion", "request_user_input", "ask_user", "askUserQuestion"})
WRITE_TOOLS = frozenset({"Edit", "Write", "MultiEdit", "NotebookEdit"})
PREFERENCE_TEXT: dict[str, str] = {
    "prefer": "When a request leaves a material decision open that the repository cannot "
    "answer, ask the user before acting on it.",
    "minimize": "Ask the user only when you cannot proceed safely; otherwise make a reasonable "
    "assumption, state it, and continue.",
}
_GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "evalloop",
    "GIT_AUTHOR_EMAIL": "evalloop@localhost",
    "GIT_COMMITTER_NAME": "evalloop",
    "GIT_COMMITTER_EMAIL": "evalloop@localhost",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}
# Login state the CLI keeps in ~/.claude.json; everything else there (projects, history) stays.
_LOGIN_KEYS = ("oauthAccount", "userID", "primaryApiKey", "customApiKeyResponses")
_ENV_KEEP = re.compile(
    r"^(PATH|LANG|LANGUAGE|TZ|TMPDIR|TERM|USER|LOGNAME|SHELL|NO_COLOR|SSL_CERT_FILE|SSL_CERT_DIR|"
    r"NODE_EXTRA_CA_CERTS|(HTTPS?|NO|ALL)_PROXY|(https?|no)_proxy|LC_\w+|ANTHROPIC_\w+|"
    r"CLAUDE_CODE_\w+|AWS_\w+|GOOGLE_\w+|CLOUD_ML_\w+|VERTEX_\w+|EVALLOOP_\w+)$"
)
_ENV_DROPPED = frozenset({"CLAUDECODE", "CLAUDE_CODE_ENTRYPOINT", "CLAUDE_PROJECT_DIR"})


class RunError(Exception):
    """A run that produced no verdict; ``kind`` says which stage failed."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind


# --- the sandbox ------------------------------------------------------------------------------


@dataclass
class Sandbox:
    """A run's scratch directories: the repository, the isolated HOME, scripted commands."""

    root: Path
    repo: Path
    home: Path
    bin: Path
    home_before: dict[str, tuple[int, int]] = field(default_factory=dict)

    def remove(self) -> None:
        """Delete the sandbox."""
        shutil.rmtree(self.root, ignore_errors=True)


def catalog_ids(catalog_root: Path) -> list[str]:
    """The skill ids of a catalog: directories holding a SKILL.md."""
    return sorted(p.parent.name for p in catalog_root.glob("*/SKILL.md"))


def catalog_sha(catalog_root: Path) -> str:
    """sha256 over every installed file of the catalog (evals excluded): a catalog pin, since
    a trigger rate depends on every description, not only the tested skill's."""
    digest = hashlib.sha256()
    for skill_id in catalog_ids(catalog_root):
        for path in sorted((catalog_root / skill_id).rglob("*")):
            rel = path.relative_to(catalog_root)
            if path.is_file() and not _excluded(rel.parts[1:]):
                digest.update(str(rel).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _excluded(parts: tuple[str, ...]) -> bool:
    # An installed skill has no scenarios: one agent was seen reading them.
    return bool(parts) and parts[0] in ("evals", "runs", "__pycache__")


def build_sandbox(
    scenario: Scenario,
    skill_dir: Path,
    *,
    catalog_root: Path,
    preference: str,
    fixtures_dir: Path | None,
) -> Sandbox:
    """Create and commit the sandbox of one run; raises RunError (fixture, sandbox, setup)."""
    root = Path(tempfile.mkdtemp(prefix="evalloop-skill-")).resolve()
    box = Sandbox(root=root, repo=root / "repo", home=root / "home", bin=root / "bin")
    try:
        _copy_fixture(scenario, fixtures_dir, box.repo)
        _install_catalog(catalog_root, box.repo / SKILLS_DIR)
        if preference in PREFERENCE_TEXT:
            _write_preference(box.repo, preference)
        _install_bin(scenario, skill_dir, box.bin)
        _seed_home(box.home)
        _git(box, "init", "-q", "--initial-branch=main")
        _git(box, "add", "-A")
        _git(box, "commit", "-q", "--allow-empty", "--no-verify", "-m", "sandbox")
        if scenario.setup:
            _run_setup(box, scenario.setup)
        box.home_before = _snapshot(box.home)
    except BaseException:
        box.remove()
        raise
    return box


def _copy_fixture(scenario: Scenario, fixtures_dir: Path | None, repo: Path) -> None:
    if scenario.fixture is None:
        repo.mkdir(parents=True)
        (repo / "README.md").write_text("# sandbox\n", encoding="utf-8")
        return
    source = (fixtures_dir / scenario.fixture) if fixtures_dir else None
    if source is None or not source.is_dir():
        raise RunError(
            "fixture",
            f"scenario {scenario.name!r} names fixture {scenario.fixture!r}, but "
            f"{source or 'no --eval-skill-fixtures directory'} is not a directory; create it or "
            "pass --eval-skill-fixtures",
        )
    shutil.copytree(source, repo, symlinks=True, ignore=shutil.ignore_patterns(".git"))


def _install_catalog(catalog_root: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for skill_id in catalog_ids(catalog_root):
        shutil.copytree(
            catalog_root / skill_id,
            target / skill_id,
            ignore=shutil.ignore_patterns("evals", "runs", "__pycache__"),
        )


def _write_preference(repo: Path, preference: str) -> None:
    memory = repo / "CLAUDE.md"
    before = memory.read_text(encoding="utf-8") + "\n" if memory.is_file() else ""
    memory.write_text(before + "## Questions\n\n" + PREFERENCE_TEXT[preference] + "\n", "utf-8")


def _install_bin(scenario: Scenario, skill_dir: Path, bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True)
    for name, script in scenario.bin.items():
        source = skill_dir / script
        if not source.is_file():
            raise RunError(
                "sandbox",
                f"scenario {scenario.name!r}: bin {name!r} points at {source}, which is not a "
                "file; fix the path (relative to the skill directory)",
            )
        shutil.copy2(source, bin_dir / name)
        (bin_dir / name).chmod(0o755)


def _seed_home(home: Path) -> None:
    """Only what login needs: the credentials file and the login keys of ``~/.claude.json``."""
    (home / ".claude").mkdir(parents=True)
    real = Path.home()
    credentials = real / ".claude" / ".credentials.json"
    if credentials.is_file():
        shutil.copy2(credentials, home / ".claude" / ".credentials.json")
    try:
        config = json.loads((real / ".claude.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(config, dict):
        login = {k: config[k] for k in _LOGIN_KEYS if k in config}
        login["hasCompletedOnboarding"] = True
        (home / ".claude.json").write_text(json.dumps(login), encoding="utf-8")


def write_back_login(box: Sandbox) -> None:
    """A refreshed OAuth token lands in the sandbox HOME; keep it for the next run."""
    fresh = box.home / ".claude" / ".credentials.json"
    real = Path.home() / ".claude" / ".credentials.json"
    if fresh.is_file() and real.is_file() and fresh.read_bytes() != real.read_bytes():
        shutil.copy2(fresh, real)


def _git_env(box: Sandbox) -> dict[str, str]:
    return {**os.environ, **_GIT_IDENTITY, "HOME": str(box.home)}


def _git(box: Sandbox, *args: str) -> str:
    argv = ["git", "-c", "core.hooksPath=/dev/null", "-c", "commit.gpgsign=false", *args]
    done = subprocess.run(
        argv, cwd=box.repo, env=_git_env(box), capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RunError(
            "sandbox", f"git {' '.join(args)} failed in {box.repo}: {done.stderr.strip()[-500:]}"
        )
    return done.stdout


def _run_setup(box: Sandbox, script: str) -> None:
    env = _git_env(box)
    env["PATH"] = f"{box.bin}{os.pathsep}{env.get('PATH', '')}"
    try:
        done = subprocess.run(
            ["sh", "-e", "-c", script],
            cwd=box.repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=SETUP_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RunError("setup", f"setup did not finish within {SETUP_TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        raise RunError(
            "setup",
            f"setup exited with code {done.returncode}: {(done.stderr or done.stdout)[-500:]}",
        )


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            stat = path.stat()
            out[str(path.relative_to(root))] = (stat.st_size, stat.st_mtime_ns)
    return out


def file_changes(box: Sandbox) -> list[str]:
    """Changed repository paths (``git status``), then changed HOME paths as ``~/path``."""
    status = _git(box, "status", "--porcelain", "--untracked-files=all", "--no-renames")
    changed = [line[3:].strip().strip('"') for line in status.splitlines() if len(line) > 3]
    after = _snapshot(box.home)
    home = [
        f"~/{p}"
        for p in sorted(set(after) | set(box.home_before))
        if after.get(p) != box.home_before.get(p)
    ]
    return changed + home


def diff_text(box: Sandbox, changes: list[str]) -> str:
    """``git status``, ``git diff`` and the content of new files, for the judge."""
    status = _git(box, "status", "--short", "--untracked-files=all")
    diff = _git(box, "diff", "HEAD")
    parts = ["$ git status --short\n" + (status or "(clean)\n"), "$ git diff\n" + diff]
    for rel in changes:
        path = box.repo / rel
        if not rel.startswith("~/") and path.is_file() and f"b/{rel}" not in diff:
            parts.append(f"--- new file {rel}\n" + path.read_text("utf-8", "replace"))
    text = "\n".join(parts)
    return text if len(text) <= DIFF_CHARS else text[:DIFF_CHARS] + "\n[... diff cut]"


# --- the agent run ----------------------------------------------------------------------------


@dataclass
class CliRun:
    """What the CLI printed and how it ended."""

    events: list[dict[str, Any]]
    exit_code: int | None
    stderr: str
    seconds: float
    timed_out: bool = False


def claude_argv(executable: str, prompt: str, *, mode: Mode, model: str | None = None) -> list[str]:
    """The headless command line of one run (activation: read-only, 8 turns; full: edits
    accepted, 30 turns)."""
    # A prompt starting with "-" would read as a flag; a leading space changes nothing else.
    argv = [executable, "-p", f" {prompt}" if prompt.startswith("-") else prompt]
    argv += ["--output-format", "stream-json", "--verbose", "--no-session-persistence"]
    argv += ["--max-turns", str(MAX_TURNS[mode]), "--permission-mode", PERMISSION_MODE[mode]]
    if mode == "activation":
        argv += ["--disallowedTools", *READ_ONLY_DENIED]
    else:
        argv += ["--allowedTools", *FULL_MODE_ALLOWED]
    if model:
        argv += ["--model", model]
    return argv


def prompt_for(scenario: Scenario) -> str:
    """The prompt as sent: an explicit scenario types ``/<id>`` first."""
    text = scenario.prompt.strip()
    return f"/{scenario.skill} {text}" if scenario.invocation == "explicit" else text


def cli_env(box: Sandbox, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """An allow-listed environment with the isolated HOME and ``bin/`` first on PATH."""
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if _ENV_KEEP.match(k) and k not in _ENV_DROPPED}
    env["PATH"] = f"{box.bin}{os.pathsep}{environ.get('PATH', os.defpath)}"
    env["HOME"] = str(box.home)
    env["PWD"] = str(box.repo)
    return env


def run_cli(argv: list[str], *, cwd: Path, env: dict[str, str], timeout_s: float) -> CliRun:
    """Run the CLI to its end or the deadline (then TERM, and KILL after a grace period)."""
    started = time.monotonic()
    try:
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own group: a timeout stops what it started too
        )
    except OSError as exc:
        raise RunError(
            "provider", f"could not start {argv[0]!r} ({exc.strerror or exc}); is it installed?"
        ) from exc
    timed_out = False
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _signal_group(process.pid, signal.SIGTERM)
        try:
            out, err = process.communicate(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(process.pid, signal.SIGKILL)
            out, err = process.communicate()
    events = list(_events(out.decode("utf-8", "replace")))
    return CliRun(
        events=events,
        exit_code=process.returncode,
        stderr=err.decode("utf-8", "replace")[-2_000:],
        seconds=round(time.monotonic() - started, 3),
        timed_out=timed_out,
    )


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _events(text: str) -> Iterable[dict[str, Any]]:
    from pytest_evalloop.claude_code import stream_event

    for line in text.splitlines():
        event = stream_event(line)
        if event is not None:
            yield event


def provider_error(run: CliRun, timeout_s: float, env: Mapping[str, str]) -> str | None:
    """Why a run is not scorable (timeout, crash, error result), or None when it is.

    ``error_max_turns`` is scored: the agent ran out of turns, which says something about it.
    """
    tail = _redact(run.stderr.strip()[-500:], env)
    said = f"; stderr ends: {tail}" if tail else ""
    if run.timed_out:
        return f"the CLI did not finish within {timeout_s:g} s and was killed{said}"
    result = next((e for e in reversed(run.events) if e.get("type") == "result"), None)
    if result is None:
        return f"the CLI exited with code {run.exit_code} before its result event{said}"
    subtype = str(result.get("subtype") or "")
    if subtype == "error_max_turns":
        return None
    if run.exit_code != 0 or result.get("is_error"):
        return f"the CLI ended with {subtype or 'an error'} (exit code {run.exit_code}){said}"
    return None


def _redact(text: str, env: Mapping[str, str]) -> str:
    from pytest_evalloop.redaction import environment_secrets, redact

    return redact(text, environment_secrets(env) + environment_secrets())


# --- the transcript ---------------------------------------------------------------------------


@dataclass
class ToolCall:
    """One ``tool_use`` of the transcript and whether its result was an error."""

    name: str
    input: dict[str, Any]
    id: str = ""
    is_error: bool | None = None

    @property
    def input_text(self) -> str:
        """The input as compact JSON, the form the detectors search."""
        return json.dumps(self.input, ensure_ascii=False, separators=(",", ":"))


@dataclass
class Transcript:
    """What a stream-json transcript says: the agent's calls, injected texts, the result."""

    tool_calls: list[ToolCall] = field(default_factory=list)
    user_texts: list[str] = field(default_factory=list)
    assistant_texts: list[str] = field(default_factory=list)
    result: dict[str, Any] | None = None
    visible_skills: list[str] | None = None
    slash_commands: list[str] = field(default_factory=list)
    version: str | None = None
    model: str | None = None

    @property
    def final_text(self) -> str:
        """The final response: the result text, else the last assistant text."""
        text = (self.result or {}).get("result")
        if isinstance(text, str) and text.strip():
            return text
        return self.assistant_texts[-1] if self.assistant_texts else ""

    @property
    def subtype(self) -> str | None:
        """The result event's subtype (``success``, ``error_max_turns``, ...)."""
        value = (self.result or {}).get("subtype")
        return str(value) if value else None

    def commands(self) -> list[str]:
        """Shell commands the agent ran (any tool input with a ``command`` string)."""
        return [str(c.input["command"]) for c in self.tool_calls if "command" in c.input]


def read_transcript(events: list[dict[str, Any]]) -> Transcript:
    """Parse stream-json events into a :class:`Transcript`."""
    t = Transcript()
    by_id: dict[str, ToolCall] = {}
    for event in events:
        kind = event.get("type")
        if kind == "system" and event.get("subtype") == "init":
            _read_init(t, event)
        elif kind == "result":
            t.result = event
        message = event.get("message")
        if kind not in ("assistant", "user") or not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            (t.user_texts if kind == "user" else t.assistant_texts).append(content)
            continue
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict):
                _read_block(t, kind, block, by_id)
    return t


def _read_init(t: Transcript, event: dict[str, Any]) -> None:
    skills = event.get("skills")
    if isinstance(skills, list):
        t.visible_skills = [_skill_name(s) for s in skills]
    slash = event.get("slash_commands")
    t.slash_commands = [_skill_name(s) for s in slash] if isinstance(slash, list) else []
    t.version = str(event.get("claude_code_version") or "") or None
    t.model = str(event.get("model") or "") or None


def _skill_name(entry: Any) -> str:
    name = entry.get("name", "") if isinstance(entry, dict) else entry
    return str(name).lstrip("/")


def _read_block(
    t: Transcript, kind: Any, block: dict[str, Any], by_id: dict[str, ToolCall]
) -> None:
    btype = block.get("type")
    if kind == "assistant" and btype == "tool_use":
        raw = block.get("input")
        call = ToolCall(str(block.get("name") or ""), raw if isinstance(raw, dict) else {})
        call.id = str(block.get("id") or "")
        t.tool_calls.append(call)
        by_id[call.id] = call
    elif kind == "assistant" and btype == "text":
        t.assistant_texts.append(str(block.get("text") or ""))
    elif kind == "user" and btype == "text":
        t.user_texts.append(str(block.get("text") or ""))
    elif kind == "user" and btype == "tool_result":
        found = by_id.get(str(block.get("tool_use_id")))
        if found is not None:
            found.is_error = bool(block.get("is_error"))


# --- activation -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evidence:
    """Why a skill counts as activated: the tier, the tool (or marker), a short detail."""

    tier: str
    tool: str
    detail: str
    counts: bool = True
    """False for a Skill call that failed: attempted, not activated."""

    def as_dict(self) -> dict[str, Any]:
        """The ledger form."""
        return {"tier": self.tier, "tool": self.tool, "detail": self.detail[:300]}


def _named(value: Any, skill_id: str) -> bool:
    # "/id", "ns:id" (a plugin skill) and "id" all name the skill.
    return isinstance(value, str) and value.strip().lstrip("/").split(":")[-1] == skill_id


def activation_evidence(t: Transcript, skill_id: str, *, explicit: bool) -> list[Evidence]:
    """Everything in the transcript showing ``skill_id`` was invoked; the final text never
    counts.

    A: a ``Skill`` call naming it (``skill``, legacy ``command`` or ``name``); B: any tool input
    touching ``skills/<id>/SKILL.md``; C: the injected markers (``<command-name>/<id>``, "Base
    directory for this skill: …/skills/<id>"), and for an explicit scenario the id among the
    slash commands of a run that succeeded.
    """
    found: list[Evidence] = []
    path = re.compile(rf"skills[\\/]+{re.escape(skill_id)}[\\/]+SKILL\.md")
    for call in t.tool_calls:
        if call.name == "Skill" and any(
            _named(call.input.get(k), skill_id) for k in ("skill", "command", "name")
        ):
            ok = call.is_error is not True
            found.append(Evidence("A", "Skill", call.input_text, counts=ok))
        elif path.search(call.input_text.replace("\\/", "/")):
            found.append(Evidence("B", call.name, call.input_text))
    marker = re.compile(
        rf"<command-name>/?{re.escape(skill_id)}</command-name>"
        rf"|Base directory for this skill:\s*\S*skills[\\/]+{re.escape(skill_id)}\b"
    )
    for text in t.user_texts:
        hit = marker.search(text)
        if hit:
            found.append(Evidence("C", "marker", hit.group(0)))
    if explicit and skill_id in t.slash_commands and t.subtype == "success":
        found.append(Evidence("C", "slash_commands", f"/{skill_id} expanded by the CLI"))
    return found


def activated(evidence: list[Evidence]) -> bool:
    """Whether any piece of evidence counts."""
    return any(e.counts for e in evidence)


# --- forbid, rules, questions -----------------------------------------------------------------


def written_paths(t: Transcript, repo: Path) -> list[str]:
    """Paths the agent tried to write with an edit tool, relative to the repo when inside."""
    out = []
    for call in t.tool_calls:
        raw = call.input.get("file_path") or call.input.get("notebook_path")
        if call.name in WRITE_TOOLS and isinstance(raw, str):
            path = Path(raw)
            if path.is_absolute() and path.is_relative_to(repo):
                raw = str(path.relative_to(repo))
            out.append(raw)
    return out


def _glob_hit(patterns: Iterable[str], paths: Iterable[str]) -> list[tuple[str, str]]:
    return [(g, p) for g in patterns for p in paths if fnmatch.fnmatchcase(p, g)]


def forbid_violations(
    scenario: Scenario, t: Transcript, changes: list[str], attempted_writes: list[str]
) -> list[str]:
    """Each forbidden action the run took, as a sentence with its evidence."""
    forbid = scenario.forbid
    if forbid is None:
        return []
    out = []
    for pattern in forbid.commands:
        out += [
            f"ran forbidden command {c!r} (matches {pattern!r})"
            for c in t.commands()
            if re.search(pattern, c)
        ]
    for glob, path in _glob_hit(forbid.files, [*changes, *attempted_writes]):
        out.append(f"touched forbidden file {path!r} (matches {glob!r})")
    for pattern in forbid.output:
        if re.search(pattern, t.final_text):
            out.append(f"final response matches forbidden output {pattern!r}")
    return sorted(set(out))


def grade_rule(rule: RubricRule, t: Transcript, changes: list[str], repo: Path) -> tuple[bool, str]:
    """Grade one deterministic rubric item: whether it holds, and why."""
    commands, text = t.commands(), t.final_text
    if rule.command is not None:
        hit = next((c for c in commands if re.search(rule.command, c)), None)
        return hit is not None, f"ran {hit!r}" if hit else f"no command matched {rule.command!r}"
    if rule.no_command is not None:
        hit = next((c for c in commands if re.search(rule.no_command, c)), None)
        return hit is None, f"ran {hit!r}" if hit else "no matching command"
    if rule.output is not None:
        ok = re.search(rule.output, text) is not None
        return ok, f"final response {'matches' if ok else 'does not match'} {rule.output!r}"
    if rule.no_output is not None:
        ok = re.search(rule.no_output, text) is None
        return ok, f"final response {'does not match' if ok else 'matches'} {rule.no_output!r}"
    if rule.file_changed is not None:
        hits = _glob_hit([rule.file_changed], changes)
        return bool(
            hits
        ), f"changed {hits[0][1]!r}" if hits else f"nothing matching {rule.file_changed!r} changed"
    if rule.file_unchanged is not None:
        hits = _glob_hit([rule.file_unchanged], changes)
        return not hits, f"changed {hits[0][1]!r}" if hits else "unchanged"
    assert rule.file_contains is not None
    spec = rule.file_contains
    for path in sorted(repo.glob(spec.path)):
        if path.is_file() and re.search(spec.pattern, path.read_text("utf-8", "replace")):
            return True, f"{path.relative_to(repo)} matches {spec.pattern!r}"
    return False, f"no file matching {spec.path!r} contains {spec.pattern!r}"


_FENCE = re.compile(r"```.*?```", re.DOTALL)
_ASKS = re.compile(r"\?(\s|\*|$)")


def asked_heuristic(t: Transcript) -> tuple[bool, bool]:
    """(asked, used a structured question tool): a question tool call, or a final paragraph
    ending in a question that is not about approval or permission."""
    structured = any(c.name in QUESTION_TOOLS for c in t.tool_calls)
    paragraphs = [p for p in _FENCE.sub("", t.final_text).split("\n\n") if p.strip()]
    last = paragraphs[-1] if paragraphs else ""
    closing = bool(_ASKS.search(last)) and not re.search(r"approv|permission", last, re.I)
    return structured or closing, structured


def run_summary(t: Transcript, diff: str | None) -> str:
    """The judge's view of a run: numbered tool calls, the final response, the final state."""
    lines = [f"{n}. {c.name} {c.input_text[:300]}" for n, c in enumerate(t.tool_calls, 1)]
    parts = ["### Tool calls\n" + ("\n".join(lines) or "(none)")]
    parts.append("### Final response\n" + (t.final_text or "(empty)"))
    if diff is not None:
        parts.append("### Files changed in the repository (final state)\n" + diff)
    return "\n\n".join(parts)


def interaction_failures(
    scenario: Scenario, preference: str, asked: bool, verdict: InteractionVerdict | None
) -> list[str]:
    """Why the question behaviour of a run fails its scenario; provider-default never fails
    (it is the baseline we do not shape) and a scenario without ``interaction`` has nothing."""
    spec = scenario.interaction
    if spec is None or preference not in ("prefer", "minimize"):
        return []
    out = []
    if spec.ambiguity == "repository-answerable" and asked:
        out.append("asked the user something the repository answers")
    deferred = bool(
        verdict and verdict.proceeded_with_assumption and verdict.assumption_was_reasonable
    )
    if spec.ambiguity == "missing-information" and not (asked or deferred):
        out.append(
            "neither asked for the missing information nor proceeded on a stated, reasonable assumption"
        )
    if verdict is not None:
        if verdict.asked_user and verdict.question_was_material is False:
            out.append(f"asked an immaterial question ({verdict.reason})")
        if verdict.asked_user and verdict.question_was_repository_answerable:
            out.append(f"asked a question the repository answers ({verdict.reason})")
        if verdict.assumption_was_reasonable is False:
            out.append(f"proceeded on an unreasonable assumption ({verdict.reason})")
        if verdict.task_succeeded is False:
            out.append(f"the task did not succeed ({verdict.reason})")
    return out


# --- one run, end to end ----------------------------------------------------------------------


@dataclass(frozen=True)
class RunSpec:
    """Everything one scenario run depends on."""

    scenario: Scenario
    skill_dir: Path
    catalog_root: Path
    backend: str = "claude-code"
    mode: Mode = "activation"
    preference: str = "provider-default"
    sample: int | None = None
    timeout_s: float = 300.0
    rubric_threshold: float = 0.75
    fixtures_dir: Path | None = None
    model: str | None = None


@dataclass
class Outcome:
    """The verdict of one run and everything recorded about it."""

    status: Literal["passed", "failed", "error"]
    activated: bool | None = None
    evidence: list[Evidence] = field(default_factory=list)
    other_activations: list[str] = field(default_factory=list)
    visible_skills: list[str] = field(default_factory=list)
    foreign_skills: list[str] = field(default_factory=list)
    asked_user: bool | None = None
    asked_source: Literal["judge", "heuristic"] | None = None
    used_structured_question: bool | None = None
    interaction: dict[str, Any] | None = None
    rubric: list[dict[str, Any]] = field(default_factory=list)
    rubric_score: float | None = None
    violations: list[str] = field(default_factory=list)
    file_changes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    error_kind: ErrorKind | None = None
    error: str | None = None
    judged: bool = False
    transcript: Transcript = field(default_factory=Transcript)
    events: list[dict[str, Any]] = field(default_factory=list)
    seconds: float | None = None


def execute(
    spec: RunSpec, judge: SkillJudge | None, agent: AnthropicSkillAgent | None = None
) -> Outcome:
    """Run one scenario once in a fresh sandbox and grade it; never raises RunError.

    The ``anthropic`` backend runs ``agent`` (None: no endpoint is configured, an error)."""
    if spec.backend == "anthropic" and agent is None:
        # Checked before any sandbox is built: nothing can run, and nothing should be left.
        return Outcome(
            status="error",
            error_kind="provider",
            error="the anthropic skill backend calls the Messages API, and no endpoint is "
            "configured: set ANTHROPIC_API_KEY (and ANTHROPIC_BASE_URL for another "
            "Anthropic-compatible endpoint), or run --eval-skill-backends=claude-code, or "
            "--eval-lint-only for the offline release gate",
        )
    try:
        box = build_sandbox(
            spec.scenario,
            spec.skill_dir,
            catalog_root=spec.catalog_root,
            preference=spec.preference,
            fixtures_dir=spec.fixtures_dir,
        )
    except RunError as exc:
        return Outcome(status="error", error_kind=exc.kind, error=str(exc))
    try:
        if agent is not None and spec.backend == "anthropic":
            return _run_agent(box, spec, judge, agent)
        return _run_in(box, spec, judge)
    finally:
        write_back_login(box)
        box.remove()


def _run_in(box: Sandbox, spec: RunSpec, judge: SkillJudge | None) -> Outcome:
    env = cli_env(box)
    executable = shutil.which("claude", path=env["PATH"])
    if executable is None:
        return Outcome(
            status="error",
            error_kind="provider",
            error="the claude-code backend runs the `claude` CLI, but none is on PATH; install "
            "Claude Code (npm install -g @anthropic-ai/claude-code) and log in",
        )
    argv = claude_argv(executable, prompt_for(spec.scenario), mode=spec.mode, model=spec.model)
    run = run_cli(argv, cwd=box.repo, env=env, timeout_s=spec.timeout_s)
    error = provider_error(run, spec.timeout_s, env)
    return _verdict(box, spec, judge, run.events, run.seconds, error)


def _run_agent(
    box: Sandbox, spec: RunSpec, judge: SkillJudge | None, agent: AnthropicSkillAgent
) -> Outcome:
    """The ``anthropic`` backend: the Messages API loop, its events read like the CLI's."""
    scenario = spec.scenario
    run = agent.run(
        box.repo,
        prompt_for(scenario),
        mode=spec.mode,
        explicit_skill=scenario.skill if scenario.invocation == "explicit" else None,
        timeout_s=spec.timeout_s,
    )
    return _verdict(box, spec, judge, run.events, run.seconds, run.error)


def _verdict(
    box: Sandbox,
    spec: RunSpec,
    judge: SkillJudge | None,
    events: list[dict[str, Any]],
    seconds: float,
    error: str | None,
) -> Outcome:
    """Read the transcript and the sandbox, whichever backend wrote them, and grade the run."""
    t = read_transcript(events)
    changes = file_changes(box)
    out = Outcome(status="passed", transcript=t, events=events, seconds=seconds)
    out.file_changes = changes
    out.violations = forbid_violations(spec.scenario, t, changes, written_paths(t, box.repo))
    out.visible_skills = t.visible_skills or []
    try:
        _check_run(error, t, spec)
        _score(out, box, spec, judge)
    except RunError as exc:
        out.status, out.error_kind, out.error = "error", exc.kind, str(exc)
        out.activated = None
    if out.violations:
        # A forbidden action fails the run whatever else happened, errors included.
        out.status = "failed"
        out.failures = [*out.violations, *out.failures]
    return out


def _check_run(error: str | None, t: Transcript, spec: RunSpec) -> None:
    if error:
        raise RunError("provider", error)
    visible = t.visible_skills
    if visible and spec.scenario.skill not in visible:
        raise RunError(
            "isolation",
            f"skill {spec.scenario.skill!r} is not among the skills the agent sees ({visible}); "
            "check its SKILL.md frontmatter (a skill Claude cannot load is not a negative)",
        )
    personal = Path.home() / SKILLS_DIR
    foreign = [
        s
        for s in visible or []
        if (personal / s).is_dir() and s not in catalog_ids(spec.catalog_root)
    ]
    if foreign:
        raise RunError(
            "isolation",
            f"personal skills outside the catalog are visible to the agent: {foreign}; the "
            "sandbox HOME leaked",
        )


def _score(out: Outcome, box: Sandbox, spec: RunSpec, judge: SkillJudge | None) -> None:
    scenario, t = spec.scenario, out.transcript
    explicit = scenario.invocation == "explicit"
    out.evidence = activation_evidence(t, scenario.skill, explicit=explicit)
    out.activated = activated(out.evidence)
    out.other_activations = [
        other
        for other in catalog_ids(spec.catalog_root)
        if other != scenario.skill and activated(activation_evidence(t, other, explicit=False))
    ]
    asked, structured = asked_heuristic(t)
    out.asked_user, out.asked_source, out.used_structured_question = asked, "heuristic", structured
    if out.activated != scenario.positive:
        want = "activate" if scenario.positive else "stay unused"
        got = "it was invoked" if out.activated else "it was not invoked"
        out.failures.append(f"expected skill {scenario.skill!r} to {want}, but {got}")
    verdict = _grade(out, box, spec, judge)
    if verdict is not None:
        out.interaction = verdict.model_dump(by_alias=True)
        if verdict.asked_user is not None:
            out.asked_user, out.asked_source = verdict.asked_user or structured, "judge"
    out.failures += interaction_failures(scenario, spec.preference, bool(out.asked_user), verdict)
    if out.rubric_score is not None and out.rubric_score < spec.rubric_threshold:
        missed = [r["criterion"] for r in out.rubric if not r["pass"]]
        out.failures.append(
            f"rubric {out.rubric_score:.0%} is under the threshold {spec.rubric_threshold:.0%}; "
            f"missed: {missed}"
        )
    out.status = "failed" if out.failures else "passed"


def _grade(
    out: Outcome, box: Sandbox, spec: RunSpec, judge: SkillJudge | None
) -> InteractionVerdict | None:
    """Rubric (positive scenarios in full mode) and the interaction verdict (full mode)."""
    scenario, t = spec.scenario, out.transcript
    if spec.mode != "full":
        return None
    rules = [r for r in scenario.rubric if isinstance(r, RubricRule)] if scenario.positive else []
    prose = [r for r in scenario.rubric if isinstance(r, str)] if scenario.positive else []
    for rule in rules:
        ok, why = grade_rule(rule, t, out.file_changes, box.repo)
        criterion = rule.criterion or _rule_text(rule)
        out.rubric.append({"criterion": criterion, "pass": ok, "reason": why, "source": "rule"})
    interaction = scenario.interaction.model_dump() if scenario.interaction else None
    verdict = None
    if prose or interaction:
        reply = _ask_judge(judge, scenario, t, diff_text(box, out.file_changes), prose, interaction)
        out.judged = True
        out.rubric += [
            {"criterion": i.criterion, "pass": i.passed, "reason": i.reason, "source": "judge"}
            for i in reply.items
        ]
        verdict = reply.interaction
    if out.rubric:
        out.rubric_score = sum(bool(r["pass"]) for r in out.rubric) / len(out.rubric)
    return verdict


def _rule_text(rule: RubricRule) -> str:
    return json.dumps(rule.model_dump(by_alias=True, exclude_none=True), sort_keys=True)


def _ask_judge(
    judge: SkillJudge | None,
    scenario: Scenario,
    t: Transcript,
    diff: str,
    prose: list[str],
    interaction: dict[str, Any] | None,
) -> RubricReply:
    import asyncio

    if judge is None:
        raise RunError(
            "judge",
            f"scenario {scenario.name!r} has prose rubric items or an interaction block, which "
            "only the skill judge grades, and no judge is configured: set ANTHROPIC_API_KEY (or "
            "ANTHROPIC_BASE_URL), or run --eval-skill-mode=activation",
        )
    request = RubricRequest(
        prompt=scenario.prompt,
        summary=run_summary(t, diff),
        criteria=prose,
        interaction=interaction,
    )
    try:
        return asyncio.run(judge.grade(request))
    except Exception as exc:  # any judge failure leaves the run ungraded: an error, not a fail
        raise RunError("judge", f"the skill judge failed: {type(exc).__name__}: {exc}") from exc


# --- the ledger -------------------------------------------------------------------------------

RUNS_DIR = "runs"


@dataclass(frozen=True)
class RunPins:
    """What a skills run records in its ``run.json``."""

    session_id: str
    phase: str
    label: str | None
    backends: tuple[str, ...]
    mode: Mode
    preference: str
    samples: int
    answerer_model: str | None
    judge_model: str | None
    runs_dir: Path | None = None
    """``--eval-runs-dir``: where runs go instead of ``<root>/runs`` (as for case sets)."""


def open_skills_run(catalog_root: Path, pins: RunPins) -> Path:
    """The run directory of this session for a skills root (``<root>/runs/<label>``, or
    ``--eval-runs-dir/<label>``), created with its ``run.json`` by the first process that needs
    it; xdist workers find it by the session id."""
    import fcntl

    from pytest_evalloop import __version__, ledger

    parent = pins.runs_dir if pins.runs_dir is not None else catalog_root / RUNS_DIR
    parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(parent / ".evalloop.lock", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for child in sorted(parent.iterdir()):
            if _session_of(child) == pins.session_id:
                return child
        label = pins.label or ledger.next_label(parent, catalog_root.name, pins.phase)
        run_dir = parent / label
        if (run_dir / ledger.RUN_FILE).exists():
            raise FileExistsError(f"{run_dir} already holds a run; pick another --eval-label")
        info = ledger.RunInfo.model_validate(
            {
                "runId": label,
                "label": label,
                "sessionId": pins.session_id,
                "target": f"skills:{catalog_root.name}",
                "answerer": ",".join(pins.backends),
                "answererModel": pins.answerer_model or "cli-default",
                "phase": pins.phase,
                "started": ledger.now_iso(),
                "status": "running",
                "setName": catalog_root.name,
                "datasetSha": catalog_sha(catalog_root),
                "judgeModel": pins.judge_model,
                "judgeVersion": SKILL_JUDGE_VERSION,
                "rubricSha": rubric_sha(),
                "harnessVersion": f"pytest-evalloop {__version__}",
                "selection": {
                    "kind": "skills",
                    "mode": pins.mode,
                    "questionPreference": pins.preference,
                    "backends": list(pins.backends),
                    "samples": pins.samples,
                    "catalogSha": catalog_sha(catalog_root),
                    "skills": catalog_ids(catalog_root),
                    **_agent_pins(pins.backends),
                },
            }
        )
        ledger.write_run_info(run_dir, info)
        (run_dir / ledger.ARTIFACTS_DIR).mkdir(exist_ok=True)
        return run_dir
    finally:
        os.close(fd)


def _agent_pins(backends: tuple[str, ...]) -> dict[str, Any]:
    """The anthropic skill agent's version and prompt sha: its wording moves trigger rates."""
    if "anthropic" not in backends:
        return {}
    from pytest_evalloop.skills.anthropic_agent import SKILL_AGENT_VERSION, prompt_sha

    return {"skillAgent": {"version": SKILL_AGENT_VERSION, "promptSha": prompt_sha()}}


def _session_of(run_dir: Path) -> str | None:
    try:
        data = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data.get("sessionId") if isinstance(data, dict) else None


def record(run_dir: Path, spec: RunSpec, out: Outcome, *, qid: str) -> None:
    """Append the run's ``attempt`` and ``activation_score`` events; keep its transcript."""
    from pytest_evalloop import ledger
    from pytest_evalloop.sets import question_sha

    scenario, t = spec.scenario, out.transcript
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", qid) + (f"-s{spec.sample}" if spec.sample else "")
    transcript_path = None
    if out.events:
        rel = Path(ledger.ARTIFACTS_DIR) / stem / "transcript.jsonl"
        (run_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        lines = "".join(json.dumps(e) + "\n" for e in out.events)
        (run_dir / rel).write_text(_redact(lines, {}), "utf-8")
        transcript_path = str(rel)
    usage = (t.result or {}).get("usage") or {}
    cost = (t.result or {}).get("total_cost_usd")
    phase = _phase(run_dir)
    attempt = ledger.AttemptEvent(
        qid=qid,
        sample=spec.sample,
        phase=phase,
        question_sha=question_sha(prompt_for(scenario)),
        submitted=out.status != "error",
        final_query=None,
        host_tool_uses=len(t.tool_calls),
        input_tokens=_int(usage.get("input_tokens")),
        output_tokens=_int(usage.get("output_tokens")),
        cache_read_tokens=_int(usage.get("cache_read_input_tokens")),
        cache_creation_tokens=_int(usage.get("cache_creation_input_tokens")),
        cost_usd=float(cost) if isinstance(cost, int | float) else None,
        num_turns=_int((t.result or {}).get("num_turns")),
        wall_seconds=out.seconds,
        answer_text=t.final_text or None,
        transcriptPath=transcript_path,
        answerer=spec.backend,
        model=t.model or spec.model,
        error=out.error if out.status == "error" or out.error_kind else None,
    )
    score = ledger.ActivationScoreEvent.model_validate(
        {
            "qid": qid,
            "sample": spec.sample,
            "phase": phase,
            "skill": scenario.skill,
            "scenario": scenario.name,
            "backend": spec.backend,
            "mode": spec.mode,
            "questionPreference": spec.preference,
            "invocation": scenario.invocation,
            "expected": scenario.positive,
            "activated": out.activated,
            "status": out.status,
            "evidence": [e.as_dict() for e in out.evidence],
            "otherActivations": out.other_activations,
            "visibleSkills": out.visible_skills,
            "foreignSkills": out.foreign_skills,
            "askedUser": out.asked_user,
            "askedSource": out.asked_source,
            "usedStructuredQuestion": out.used_structured_question,
            "ambiguity": scenario.interaction.ambiguity if scenario.interaction else None,
            "interaction": out.interaction,
            "rubric": out.rubric,
            "rubricScore": out.rubric_score,
            "violations": out.violations,
            "fileChanges": out.file_changes[:200],
            "resultSubtype": t.subtype,
            "errorKind": out.error_kind,
            "error": out.error,
            "failures": out.failures,
            "judge_version": SKILL_JUDGE_VERSION if out.judged else None,
            "rubric_sha": rubric_sha() if out.judged else None,
        }
    )
    ledger.LedgerWriter(run_dir).append(attempt, score)


def _phase(run_dir: Path) -> str:
    try:
        return str(json.loads((run_dir / "run.json").read_text("utf-8")).get("phase") or "skills")
    except (OSError, ValueError):
        return "skills"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# --- pytest glue ------------------------------------------------------------------------------


def _pins(config: Any, settings: Any) -> RunPins:
    from pytest_evalloop.stash import SESSION_ID_KEY, SETTINGS_KEY

    core = config.stash[SETTINGS_KEY]
    judge = config.stash.get(SKILL_JUDGE_KEY, None)
    return RunPins(
        session_id=config.stash[SESSION_ID_KEY],
        phase=core.phase,
        label=core.label,
        backends=settings.backends,
        mode=settings.mode,
        preference=settings.preference,
        samples=settings.samples,
        answerer_model=core.answerer_model if "anthropic" in settings.backends else None,
        judge_model=getattr(judge, "model", None) if judge else core.judge_model,
        runs_dir=core.runs_dir,
    )


def skill_judge(config: Any) -> SkillJudge | None:
    """The session's skill judge: the one a conftest put in the stash, else the Anthropic
    judge when an endpoint is configured, else None (prose items then make a run an error)."""
    key = SKILL_JUDGE_KEY
    if key not in config.stash:
        from pytest_evalloop.backends import ClientFactory
        from pytest_evalloop.options import endpoint_missing
        from pytest_evalloop.skills.rubric_judge import AnthropicSkillJudge
        from pytest_evalloop.stash import SETTINGS_KEY

        core = config.stash[SETTINGS_KEY]
        config.stash[key] = (
            None
            if endpoint_missing()
            else AnthropicSkillJudge(
                model=core.judge_model, client_factory=ClientFactory(core.retries)
            )
        )
    judge: SkillJudge | None = config.stash[key]
    return judge


def run_item(item: Any) -> Outcome:
    """Run a scenario item once through its backend (``claude-code``: the CLI; ``anthropic``:
    the catalog offered as a ``Skill`` tool over the Messages API), record it in the skills
    run's ledger, and tell the controller where its run lives."""
    from pytest_evalloop.stash import SETTINGS_KEY as CORE_KEY

    config = item.config
    settings = config.stash[SKILLS_KEY]
    core = config.stash[CORE_KEY]
    spec = RunSpec(
        scenario=item.scenario,
        skill_dir=item.skill_dir,
        catalog_root=item.skill_dir.parent,
        backend=item.variant.backend,
        mode=settings.mode,
        preference=item.variant.preference,
        sample=item.variant.sample,
        timeout_s=core.attempt_timeout,
        rubric_threshold=settings.rubric_threshold,
        fixtures_dir=settings.fixtures_dir,
        model=core.answerer_model if item.variant.backend == "anthropic" else _model(config),
    )
    judge = skill_judge(config) if settings.mode == "full" else None
    agent = skill_agent(config) if spec.backend == "anthropic" else None
    out = execute(spec, judge, agent)
    run_dir = open_skills_run(spec.catalog_root, _pins(config, settings))
    record(run_dir, spec, out, qid=item.qid)
    item.user_properties.append(("evalloop_skill_run", str(run_dir)))
    for key in ("status", "activated"):
        item.user_properties.append((key, str(getattr(out, key))))
    return out


def skill_agent(config: Any) -> AnthropicSkillAgent | None:
    """The ``anthropic`` backend's agent, or None when no endpoint is configured (its runs are
    then provider errors saying what to set). A fresh client per run: each run has its own
    event loop, and the session's rate limit is shared through the limiter."""
    from pytest_evalloop.backends import ClientFactory
    from pytest_evalloop.options import endpoint_missing
    from pytest_evalloop.pricing import price_table
    from pytest_evalloop.skills.anthropic_agent import AnthropicSkillAgent
    from pytest_evalloop.stash import LIMITER_KEY, SETTINGS_KEY

    if endpoint_missing():
        return None
    core = config.stash[SETTINGS_KEY]
    limiter = config.stash.get(LIMITER_KEY, None)
    return AnthropicSkillAgent(
        model=core.answerer_model,
        client_factory=lambda: ClientFactory(core.retries, limiter=limiter)(),
        prices=price_table(core.prices),
    )


def _model(config: Any) -> str | None:
    # Only an explicit --eval-answerer-model pins the model; else the CLI's own default runs.
    value = config.getoption("eval_answerer_model", None)
    from pytest_evalloop.options import DEFAULT_ANSWERER_MODEL

    return None if value in (None, DEFAULT_ANSWERER_MODEL) else str(value)


def record_lint(item: Any, ctx: Any, findings: list[Any]) -> Path:
    """Append the ``skill_lint`` event of a skill to the session's skills run."""
    from pytest_evalloop import ledger
    from pytest_evalloop.skills import lint

    config = item.config
    root = item.path.parent.parent
    run_dir = open_skills_run(root, _pins(config, config.stash[SKILLS_KEY]))
    row = lint.summary_row(ctx, findings)
    skill_file = item.path.read_bytes()
    event = ledger.SkillLintEvent.model_validate(
        {
            "skill": row["skill"],
            "skillSha": hashlib.sha256(skill_file).hexdigest()[:16],
            "lines": row["lines"],
            "scenarios": row["evals"],
            "negatives": row["negative"],
            "issues": [{"level": f.level, "code": f.code, "message": f.message} for f in findings],
            "passed": lint.passed(findings),
        }
    )
    ledger.LedgerWriter(run_dir).append(event)
    return run_dir


def describe(out: Outcome | None) -> list[str]:
    """The lines under a failed or errored scenario: evidence, rubric misses, other skills."""
    if out is None:
        return []
    lines = [f"activated: {out.activated}"]
    lines += [f"  evidence {e.tier} {e.tool}: {e.detail[:160]}" for e in out.evidence]
    if out.other_activations:
        lines.append(f"also activated: {', '.join(out.other_activations)}")
    lines += [
        f"  [x] rubric: {r['criterion']} ({r['reason']})" for r in out.rubric if not r["pass"]
    ]
    lines += [f"  forbidden: {v}" for v in out.violations]
    if out.asked_user is not None:
        lines.append(f"asked the user: {out.asked_user} ({out.asked_source})")
    if out.transcript.final_text:
        lines.append(f"final response: {out.transcript.final_text[:300]!r}")
    return lines
