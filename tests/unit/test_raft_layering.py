"""The Raft core and the simulator are pure: importing them pulls in neither trio nor sockets."""

import subprocess
import sys


def test_raft_core_and_simulator_import_no_trio_and_no_socket():
    code = (
        "import sys\n"
        "import hasvc.state, hasvc.state.raft, hasvc.testing.raft_sim, hasvc.testing.checker\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('trio', 'socket', 'selectors', 'asyncio')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_state_package_docstring_is_the_shared_one():
    import hasvc.state

    assert hasvc.state.__doc__ == (
        "Pure replication decisions: no trio, no sockets, no clock reads, no store I/O "
        "(time and randomness are arguments)."
    )
