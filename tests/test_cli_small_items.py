"""The small rough edges, each pinned by what a user saw before.

- ``str(lease.token)`` is the display form, without the MAC: every resource
  refused it as ``forged (unsigned)`` and said nothing of ``token.encode()``;
- a refused bearer token said ``check auth_token``, where a CLI user sets
  ``$STOCKADE_AUTH_TOKEN``;
- an error in the ``--auth-tokens`` file named the token's ordinal, not the
  line to open the file at;
- ``stockade --data-dir D history X`` was refused: a global option before
  the command. Every global option, for every command, now means the same
  before and after it (or is refused in both places).

The ones with a server run a real `stockade serve` on a free loopback port.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HELPERS, python_env

sys.path.insert(0, str(HELPERS))
from server_fixtures import ServerProcess, start_server  # noqa: E402

import stockade  # noqa: E402
from stockade.cli import GLOBAL_OPTIONS, SUBCOMMANDS, TAKES, main  # noqa: E402
from stockade.core.errors import InvalidArgument, TokenMismatch  # noqa: E402
from stockade.server._auth import load_tokens  # noqa: E402

STOCKADE = [sys.executable, "-m", "stockade"]
AUTH_TOKEN = "small-items-token-0123456789"
SCOPED_TOKEN = "small-items-scoped-0123456789"


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in python_env().items() if not k.startswith("STOCKADE_")}
    return subprocess.run([*STOCKADE, *args], cwd=cwd, env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=120)


# -- the display form of a token -----------------------------------------------------------------------------


def test_a_refused_display_form_says_to_use_encode(tmp_path: Path) -> None:
    coord = stockade.connect(f"sqlite:///{tmp_path / 'coord.db'}")
    store = stockade.open_store(f"sqlite:///{tmp_path / 'store.db'}", cluster_id=coord.cluster_id)
    try:
        with coord.lock("reports", ttl_ms=10_000) as lease:
            with pytest.raises(TokenMismatch) as refused:
                store.put("reports", "k", b"v", token=str(lease.token))
            assert refused.value.reason == "forged (unsigned)"  # the structured field is unchanged
            assert "str(token) is only the token's display form" in str(refused.value)
            assert "token.encode()" in str(refused.value)
            store.put("reports", "k", b"v", token=lease.token.encode())  # what the message says works
    finally:
        store.close()
        coord.close()


@pytest.fixture
def auth_server(tmp_path: Path):  # type: ignore[no-untyped-def]
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# the tokens\n{AUTH_TOKEN}\n{SCOPED_TOKEN} reports.*\n")
    process = start_server(tmp_path / "server", "--auth-tokens", str(tokens))
    yield process
    process.stop()


def test_the_display_form_over_http_and_the_cli_says_the_same(auth_server: ServerProcess, tmp_path: Path) -> None:
    env = {"STOCKADE_URL": auth_server.url, "STOCKADE_AUTH_TOKEN": AUTH_TOKEN}
    show = ("import os, stockade\n"
            "print(str(stockade.FencingToken.decode(os.environ['STOCKADE_TOKEN'])))\n")
    display = cli("lock", "reports", "--", sys.executable, "-c", show, cwd=tmp_path, env=env)
    assert display.returncode == 0 and display.stdout.startswith("stk1."), display.stderr
    refused = cli("kv", "put", "reports", "k", "v", "--token", display.stdout.strip(), cwd=tmp_path, env=env)
    assert refused.returncode == 5, refused.stderr  # the token belongs elsewhere / was not issued
    assert "token.encode()" in refused.stderr and "Traceback" not in refused.stderr


# -- the bearer token's variable -----------------------------------------------------------------------------


def test_refused_credentials_name_the_environment_variable(auth_server: ServerProcess, tmp_path: Path) -> None:
    env = {"STOCKADE_URL": auth_server.url}
    missing = cli("lock", "jobs", "--", "true", cwd=tmp_path, env=env)
    assert missing.returncode == 1 and "$STOCKADE_AUTH_TOKEN" in missing.stderr, missing.stderr
    assert "check auth_token" not in missing.stderr
    # a known token outside its scopes: 403, and it says so
    scoped = cli("lock", "jobs", "--", "true", cwd=tmp_path, env={**env, "STOCKADE_AUTH_TOKEN": SCOPED_TOKEN})
    assert scoped.returncode == 1 and "$STOCKADE_AUTH_TOKEN" in scoped.stderr, scoped.stderr
    assert "does not cover this scope" in scoped.stderr
    allowed = cli("lock", "reports.daily", "--", "true", cwd=tmp_path, env={**env, "STOCKADE_AUTH_TOKEN": SCOPED_TOKEN})
    assert allowed.returncode == 0, allowed.stderr


# -- the auth-token file's line ------------------------------------------------------------------------------


@pytest.mark.parametrize(("content", "line", "said"), [
    (f"# team tokens\n\n{AUTH_TOKEN}\n   \nshort\n", 5, "the token must be"),
    (f"{AUTH_TOKEN}\n# ci\n\n{SCOPED_TOKEN} reports.* bad/pattern\n", 4, "'bad/pattern' is not a scope"),
    (f"# caf\u00e9\n{AUTH_TOKEN}\n", 1, "not ASCII"),
], ids=["short-token", "bad-pattern", "not-ascii"])
def test_an_auth_token_file_error_names_its_line(tmp_path: Path, content: str, line: int, said: str) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_bytes(content.encode())
    with pytest.raises(InvalidArgument) as refused:
        load_tokens(tokens)
    assert f"{tokens} line {line}: " in str(refused.value) and said in str(refused.value), str(refused.value)
    served = cli("serve", "--data-dir", str(tmp_path / "data"), "--port", "0", "--auth-tokens", str(tokens),
                 cwd=tmp_path)
    assert served.returncode == 2 and f"line {line}: " in served.stderr, served.stderr
    assert AUTH_TOKEN not in served.stderr  # a secret is never echoed


# -- global options before the command -----------------------------------------------------------------------


def _cases(tmp_path: Path) -> dict[tuple[str, str], tuple[list[str], str, int, str]]:
    """(command, option) -> (the command's other arguments, the option's value, exit status, what it says).

    Each value is one the command reports back, so that the option reaching it is seen in its answer.
    """
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    nowhere = tmp_path / "nowhere"
    bogus = "bogus://nowhere"
    return {
        ("demo", "--data-dir"): ([], str(a_file), 2, f"--data-dir {a_file}: exists and is not a directory"),
        ("demo", "--url"): ([], "sqlite:///x/coord.db", 2, "--url takes a stockade serve"),
        ("lock", "--data-dir"): (["x", "--", "true"], str(tmp_path / "{spelling}"), 0,
                                 f"created a new coordinator at {tmp_path}/{{spelling}}/coord.db"),
        ("lock", "--url"): (["x", "--", "true"], bogus, 2, "unknown scheme 'bogus'"),
        ("kv", "--data-dir"): (["get", "s", "k"], str(nowhere), 3, f"no store at {nowhere}/store.db"),
        ("kv", "--url"): (["get", "s", "k"], bogus, 2, f"not {bogus}"),
        ("status", "--data-dir"): ([], str(nowhere), 1, f"no coordinator at {nowhere}/coord.db"),
        ("status", "--url"): ([], bogus, 2, f"not {bogus}"),
        ("history", "--data-dir"): (["x"], str(nowhere), 1, f"no coordinator at {nowhere}/coord.db"),
        ("history", "--url"): (["x"], bogus, 2, "unknown scheme 'bogus'"),
        ("serve", "--data-dir"): (["--port", "0"], str(a_file), 1, f"cannot serve: [Errno 17] File exists: '{a_file}'"),
        ("floor", "--data-dir"): (["sqlite:///x"], str(nowhere), 1, f"no coordinator at {nowhere}/coord.db"),
        ("floor", "--url"): (["sqlite:///x"], bogus, 2, "unknown scheme 'bogus'"),
        ("keys", "--data-dir"): (["show"], str(nowhere), 1, f"no keyring at {nowhere}/coord.keys"),
        ("bench", "--data-dir"): (["--seconds", "0.1"], str(a_file), 2, f"--data-dir {a_file}: "),
        ("bench", "--url"): (["--seconds", "0.1", "--iters", "1", "--clients", "1", "--workloads", "lock"], bogus, 1,
                             "unknown scheme 'bogus'"),
        ("etcd", "--url"): (["bump-revision", "--to", "3"], "http://not-etcd", 2, "not http://not-etcd"),
        ("ui", "--data-dir"): ([], str(nowhere), 1, f"no coordinator at {nowhere}/coord.db"),
        ("ui", "--url"): ([], bogus, 2, "unknown scheme 'bogus'"),
    }


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``stockade ARGV`` in this process; `serve` in a child (it configures the process's logging)."""
    if "serve" in argv:
        done = cli(*argv, cwd=Path.cwd())
        return done.returncode, done.stdout + done.stderr
    with pytest.raises(SystemExit) as exited:
        raise SystemExit(main(argv))
    captured = capsys.readouterr()
    return int(exited.value.code or 0), captured.out + captured.err


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_every_global_option_means_the_same_before_and_after_every_command(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("STOCKADE_URL", "STOCKADE_DATA", "STOCKADE_TOKEN", "STOCKADE_AUTH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    cases = _cases(tmp_path)
    for option in GLOBAL_OPTIONS:
        if option not in TAKES[command]:
            assert (command, option) not in cases
            rest = {"keys": ["show"], "etcd": ["bump-revision"],  # its positional, or required options, first
                    "check": ["--coordinator", "memory://c", "--resource", "memory://r"]}.get(command, [])
            for spelling, argv in (("before", [option, "V", command, *rest]), ("after", [command, *rest, option, "V"])):
                code, said = _run(argv, capsys)
                assert code == 2 and option in said, (spelling, command, option, said)
            continue
        rest, value, expected_code, expected = cases[(command, option)]
        for spelling in ("before", "after"):
            given = value.replace("{spelling}", spelling)
            argv = [option, given, command, *rest] if spelling == "before" else [command, *_with(rest, option, given)]
            code, said = _run(argv, capsys)
            assert code == expected_code, (spelling, argv, said)
            assert expected.replace("{spelling}", spelling) in said, (spelling, argv, said)
            # the --opt=value spelling too
            if spelling == "before" and expected_code != 0:
                code_eq, said_eq = _run([f"{option}={given}", command, *rest], capsys)
                assert (code_eq, said_eq) == (code, said)


def _with(rest: list[str], option: str, value: str) -> list[str]:
    """``rest`` with the option added after the command's own arguments (before a ``--`` if there is one)."""
    if "--" in rest:
        split = rest.index("--")
        return [*rest[:split], option, value, *rest[split:]]
    return [*rest, option, value]


def test_every_command_and_option_is_in_the_table() -> None:
    assert set(TAKES) == set(SUBCOMMANDS)
    assert all(set(options) <= set(GLOBAL_OPTIONS) for options in TAKES.values())


def test_the_findings_spelling(tmp_path: Path) -> None:
    """``stockade --data-dir D history X``, word for word, as a real process."""
    data = tmp_path / "d"
    assert cli("lock", "x", "--data-dir", str(data), "--", "true", cwd=tmp_path).returncode == 0
    done = cli("--data-dir", str(data), "history", "x", cwd=tmp_path)
    assert done.returncode == 0 and "grant" in done.stdout, done.stderr
    assert done.stdout == cli("history", "x", "--data-dir", str(data), cwd=tmp_path).stdout


def test_misplaced_or_unknown_leading_options_are_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, said in ((["--ttl-ms", "5", "lock"], "unknown option '--ttl-ms' before the command"),
                       (["--url"], "--url needs a value"),
                       (["--url", "http://x"], "a command is needed after --url")):
        code, out = _run(argv, capsys)
        assert code == 2 and said in out, (argv, out)


def test_a_malformed_bearer_token_from_the_environment_is_named_so(tmp_path: Path) -> None:
    done = cli("status", "--url", "http://127.0.0.1:9", cwd=tmp_path, env={"STOCKADE_AUTH_TOKEN": "two words"})
    assert done.returncode in (1, 2) and "$STOCKADE_AUTH_TOKEN: must be" in done.stderr, done.stderr
    with pytest.raises(InvalidArgument) as given:  # in code, the parameter's name
        stockade.connect("http://127.0.0.1:9", auth_token="two words")
    assert given.value.field == "auth_token"
