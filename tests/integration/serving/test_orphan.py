"""A server started for a run or test stops by itself when the process that launched it dies."""

import subprocess
import sys
import textwrap
import time

from dgx_assets.serving.server import _alive


def test_server_stops_when_its_launcher_dies(quick_model, tmp_path):
    script = textwrap.dedent(f"""
        import sys, time
        from dgx_assets.generation import launcher
        server = launcher.start_server({str(quick_model)!r}, log_dir={str(tmp_path)!r})
        launcher.wait_ready([server], timeout_s=180)
        print(server.process.pid, flush=True)
        time.sleep(600)  # killed by the test, never stopping its server
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        server_pid = int(parent.stdout.readline())
        assert _alive(server_pid)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.time() + 30
    while time.time() < deadline and _alive(server_pid):
        time.sleep(0.5)
    assert not _alive(server_pid)
