"""A build without MPI: `qkv attention --ring` ends with status 2 and one line saying so,
reading and writing nothing. Usage: no_mpi_test.py QKV"""
import os
import subprocess
import sys
import tempfile

with tempfile.TemporaryDirectory() as work:
    command = [os.path.abspath(sys.argv[1]), "attention", "--ring", "--q", "q.npy", "--k",
               "k.npy", "--v", "v.npy", "--out", "o.npy"]
    r = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=60)
    lines = r.stderr.strip().splitlines()
    ok = (r.returncode == 2 and len(lines) == 1 and "this build of qkv has no MPI" in lines[0]
          and not os.listdir(work))
    print("ok" if ok else "FAIL: status %d, stderr %r" % (r.returncode, r.stderr))
    sys.exit(0 if ok else 1)
