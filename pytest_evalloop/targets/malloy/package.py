"""A Malloy package as a target: where it is, whether it compiles, and its server.

`--eval-target=malloy:<package dir>` or set.json `"target": {"kind": "malloy", "package": ...}`
names a package; `malloy_spec` resolves either into a `MalloySpec`, with the truth package
set.json names (`setpackages.truth_package`). Before anything is paid for,
`check_package` runs the server once with `--check`: the real compiler compiles every model of
the package and reports each problem with its file and line (a missing table file by name),
and the package's pins (a content sha over every model file, the compiler version); a check that
passed is reused while nothing it read has changed (`checkcache`).
`MalloyTarget` is the answerer's MCP target over `node server.mjs`, restarted once when it dies.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from pytest_evalloop.failures import HarnessError
from pytest_evalloop.sets.cases import SetConfig
from pytest_evalloop.targets.malloy import checkcache
from pytest_evalloop.targets.malloy.install import MalloyUnavailable, ensure_server, node_command
from pytest_evalloop.targets.malloy.setpackages import (
    DEFAULT_ENVIRONMENT,
    MalloyError,
    ServedPackage,
    only_model,
    setting,
    truth_package,
)
from pytest_evalloop.targets.target import MCPSession, MCPTarget

if TYPE_CHECKING:
    from mcp import StdioServerParameters

    from pytest_evalloop.targets.profiles import ToolProfile

PREFIX = "malloy:"
CHECK_TIMEOUT_S = 180.0


class MalloySpec(BaseModel):
    """Which package a set is answered against, and which package its goldens come from."""

    model_config = ConfigDict(frozen=True)

    name: str
    """The target's name in run.json (`malloy:<as given>`)."""
    root: Path
    model_path: str
    environment: str = DEFAULT_ENVIRONMENT
    truth_root: Path | None = None
    truth_model_path: str | None = None
    truth_rewrite: bool = False
    """Rewrite `duckdb.table('<path>')` in a canonical query to the truth source over that
    path (restricted mode refuses table() in query text; the truth model may use it)."""

    @property
    def package(self) -> ServedPackage:
        """The answerer's package."""
        return ServedPackage(
            root=self.root, model_path=self.model_path, environment=self.environment
        )

    @property
    def truth(self) -> ServedPackage | None:
        """The truth package, when the set names one."""
        if self.truth_root is None or self.truth_model_path is None:
            return None
        return ServedPackage(
            root=self.truth_root,
            model_path=self.truth_model_path,
            environment=self.environment,
            table_rewrite=self.truth_rewrite,
        )


class Problem(BaseModel):
    message: str
    file: str | None = None
    line: int | None = None
    code: str | None = None


class PackageCheck(BaseModel):
    """What `server.mjs --check` reported about one package."""

    ok: bool
    problems: list[Problem] = Field(default_factory=list)
    pins: dict[str, Any] = Field(default_factory=dict)
    root: str = ""
    tables: list[str] = Field(default_factory=list)
    """The table files the models name, as the server resolved them."""


def is_malloy(target: str | None, set_config: SetConfig) -> bool:
    """Whether the set is answered against a Malloy package."""
    if target is not None:
        return target.startswith(PREFIX)
    return (set_config.target or {}).get("kind") == "malloy"


def malloy_spec(set_dir: Path, set_config: SetConfig, target: str | None) -> MalloySpec:
    """The package of `--eval-target=malloy:<dir>` or of set.json's malloy target, with the
    truth package set.json names (`truth_package`) either way."""
    block = (set_config.target or {}) if (set_config.target or {}).get("kind") == "malloy" else {}
    where = f"{set_dir / 'set.json'}: target"
    if target is not None:
        given = target[len(PREFIX) :].strip()
        if not given:
            raise MalloyError("--eval-target=malloy: names no package; pass malloy:<package dir>")
        candidates = [Path(given), set_dir / given]
        root = next((p for p in candidates if p.is_dir()), None)
        if root is None:
            raise MalloyError(
                f"--eval-target={target}: no such package directory (looked for "
                f"{candidates[0].resolve()} and {candidates[1]}); pass the folder holding the "
                ".malloy files"
            )
        name = target
        model_path = block.get("modelPath")
    else:
        package = block.get("package")
        if not isinstance(package, str) or not package:
            raise MalloyError(f'{where}.package is missing; add "package": "<package dir>"')
        root = set_dir / package
        if not root.is_dir():
            raise MalloyError(f"{where}.package {package!r}: {root} is not a directory; fix it")
        name = f"{PREFIX}{set_config.name}/{package}"
        model_path = setting(set_dir, set_config, "targetModelPath")
    root = root.resolve()
    truth = truth_package(set_dir, set_config, root)
    if truth is not None and truth.root == root:
        # Seed 004: a golden is never derived from the model under test.
        raise MalloyError(
            f"{set_dir / 'set.json'}: truthPackage is {root}, the package the answerer queries; "
            "goldens must come from a package of their own (semantics-free sources over the "
            "same tables): name another truthPackage, or point --eval-target elsewhere"
        )
    return MalloySpec(
        name=name,
        root=root,
        model_path=str(model_path or _default_model(set_dir, set_config, root)),
        environment=str(setting(set_dir, set_config, "environmentName") or DEFAULT_ENVIRONMENT),
        truth_root=truth.root if truth else None,
        truth_model_path=truth.model_path if truth else None,
        truth_rewrite=truth.table_rewrite if truth else False,
    )


def _default_model(set_dir: Path, set_config: SetConfig, root: Path) -> str:
    """targetModelPath when it names a model of this package, else the package's only model."""
    named = (set_config.model_extra or {}).get("targetModelPath")
    if isinstance(named, str) and (root / named).is_file():
        return named
    return only_model(root)


def check_package(root: Path) -> PackageCheck:
    """Compile every model of the package with the real compiler (cached while its files and
    table files are unchanged)."""
    return _check(root.resolve(), _stamp(root.resolve()))


def _stamp(root: Path) -> tuple[tuple[str, int, int], ...]:
    files = [p for p in root.rglob("*") if p.suffix in (".malloy", ".parquet", ".json")]
    out = []
    for path in sorted(files):
        try:
            stat = path.stat()
        except OSError:
            continue
        out.append((str(path), stat.st_mtime_ns, stat.st_size))
    return tuple(out)


@functools.lru_cache(maxsize=16)
def _check(root: Path, _stamp: tuple[tuple[str, int, int], ...]) -> PackageCheck:
    server = ensure_server()
    check_key = checkcache.key(root, server)
    stored = checkcache.load(server, check_key, root)
    if stored is not None:
        return PackageCheck.model_validate(stored)
    command = [node_command(), str(server), "--root", str(root), "--check"]
    from pytest_evalloop.steps import announce

    announce(f"compiling the Malloy package {root} on the real compiler")
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MalloyUnavailable(f"`{' '.join(command)}` failed: {exc}") from exc
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-8:])
        raise MalloyError(f"checking the Malloy package {root} failed:\n{tail}")
    reported = json.loads(lines[-1])
    checkcache.store(server, check_key, root, reported)
    return PackageCheck.model_validate(reported)


def package_problem(spec: MalloySpec) -> str | None:
    """Why the set's packages cannot be served (one usage error's text), or None."""
    texts = []
    for served, key in ((spec.package, "target.modelPath"), (spec.truth, "truthModelPath")):
        if served is None:
            continue
        problem = served_problem(served, data_from=spec.root / "data", model_key=key)
        if problem:
            texts.append(problem)
    return "\n".join(texts) or None


_LOOKED_FOR = re.compile(r"\(looked for (.+)\)$")


def served_problem(
    served: ServedPackage, *, data_from: Path | None = None, model_key: str = "target.modelPath"
) -> str | None:
    """Why one package cannot be served: it does not compile (each problem with its file and
    line; missing table files named, with the command that makes them where one does), or it
    has no such model. `data_from` is a data folder that may hold the tables to link from."""
    try:
        check = check_package(served.root)
    except (MalloyUnavailable, MalloyError) as exc:
        return str(exc)
    root = served.root
    if not check.ok:
        lines = [
            f"  {root / p.file if p.file else root}"
            + (f":{p.line}" if p.line else "")
            + f": {p.message}"
            for p in check.problems
        ]
        missing = [
            Path(m.group(1))
            for p in check.problems
            if p.code == "missing-table-file" and (m := _LOOKED_FOR.search(p.message))
        ]
        fix = "; fix the model and run again"
        if missing:
            from pytest_evalloop.targets.malloy.gen_data import fix_command

            command = fix_command(missing, [data_from] if data_from is not None else [])
            fix = (
                f"; its table files are missing: `{command}` generates them (the malloy-samples "
                "ecommerce tables, seeded; docs/malloy.md)"
                if command
                else "; its table files are missing: copy them there (paths are relative to "
                "the package folder)"
            )
        return f"Malloy package {root} does not compile{fix}:\n" + "\n".join(lines)
    if served.model_path not in check.pins.get("models", []):
        return (
            f"Malloy package {root} has no model {served.model_path!r} (it holds "
            f"{', '.join(check.pins.get('models', []))}); fix {model_key}"
        )
    return None


def server_parameters(root: Path, environment: str = DEFAULT_ENVIRONMENT) -> StdioServerParameters:
    """How to start the server for one package (its npm tree installed first)."""
    from mcp import StdioServerParameters

    server = ensure_server()
    return StdioServerParameters(
        command=node_command(),
        args=[str(server), "--root", str(root), "--environment", environment],
        cwd=str(root),
    )


def target_pins(spec: MalloySpec) -> dict[str, Any]:
    """run.json pins of a malloy target: its name, the model's content sha, the compiler."""
    pins: dict[str, Any] = {"target": spec.name, "targetProfile": "publisher"}
    try:
        check = check_package(spec.root)
    except (MalloyUnavailable, MalloyError):
        return pins
    if check.pins.get("contentSha"):
        pins["modelSha"] = check.pins["contentSha"]
    if check.pins.get("compilerVersion"):
        pins["targetVersion"] = f"@malloydata/malloy {check.pins['compilerVersion']}"
    return pins


def publisher_fixed_args(spec: MalloySpec) -> dict[str, Any]:
    """The publisher profile's fixed arguments for this package (what re-execution sends)."""
    check = check_package(spec.root)
    return {
        "environmentName": spec.environment,
        "packageName": check.pins.get("package") or spec.root.name,
        "modelPath": spec.model_path,
    }


class MalloyTarget(MCPTarget):
    """The answerer's Malloy server: restarted once when it dies; a second death stops the run.

    Implements `roles.RestartingTarget`: the runtime reopens a session whose server died, and
    stops the run once `stop_reason` says the one restart is spent.
    """

    MAX_RESTARTS = 1

    def __init__(self, spec: MalloySpec, profile: ToolProfile, pins: dict[str, Any]) -> None:
        super().__init__(
            server_parameters(spec.root, spec.environment), profile, name=spec.name, pins=pins
        )
        self.spec = spec
        self.restarts = 0

    @property
    def stop_reason(self) -> str | None:
        """Why the run must stop (the server died again after its restart), or None."""
        session = self._session
        if session is None or not session.broken or self.restarts < self.MAX_RESTARTS:
            return None
        return (
            f"target {self.name}: the Malloy server died again after {self.restarts} restart, "
            "so the run stops (the server's stderr is in the pytest output). Check the package "
            f"with `{' '.join(self._check_command())}` and run again with --eval-resume"
        )

    def _check_command(self) -> list[str]:
        server = self.server
        args = list(getattr(server, "args", []))[:1]
        return [
            str(getattr(server, "command", "node")),
            *args,
            "--root",
            str(self.spec.root),
            "--check",
        ]

    def failure_advice(self, session: MCPSession) -> str:
        if not session.broken:
            return super().failure_advice(session)
        if self.restarts < self.MAX_RESTARTS:
            return "the Malloy server died; it is restarted once for the cases that follow"
        return "the Malloy server died again after its one restart, so the run stops"

    async def open(self) -> MCPSession:
        session = self._session
        if session is not None and session.broken:
            stop = self.stop_reason
            if stop is not None:
                raise HarnessError(stop)
            self.restarts += 1
        return await super().open()
