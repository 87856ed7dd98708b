"""Compile a loss and its gradient into a standalone module, then use that
module from a program that never imports tracegrad.

    python examples/standalone/compile_and_use.py [--small] [--out DIR]

Step 1 runs the command line

    tracegrad compile model.py:loss --arg w=float64[5] --arg b=float64[] \\
        --arg x=float64[400,5] --arg y=float64[400] --value-and-grad --wrt w,b \\
        -o DIR/loss_grad.py

Step 2 runs train_without_tracegrad.py in a fresh interpreter in which
`import tracegrad` is made to fail, with DIR on its path.  The generated
loss_grad.py is an ordinary, readable file: open it.
"""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", default=bool(os.environ.get("TRACEGRAD_SMALL")),
                    help="a CI-sized run (also: TRACEGRAD_SMALL=1)")
    ap.add_argument("--out", default=os.path.join(HERE, "generated"),
                    help="folder for loss_grad.py (default: examples/standalone/generated)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    module = os.path.join(args.out, "loss_grad.py")

    # `python -m tracegrad.cli` is the `tracegrad` console script, found even
    # when the virtual environment's bin folder is not on PATH
    cmd = [sys.executable, "-m", "tracegrad.cli", "compile", os.path.join(HERE, "model.py") + ":loss",
           "--arg", "w=float64[5]", "--arg", "b=float64[]", "--arg", "x=float64[400,5]",
           "--arg", "y=float64[400]", "--value-and-grad", "--wrt", "w,b", "-o", module]
    print("$ tracegrad " + " ".join(cmd[3:]))
    subprocess.run(cmd, check=True)
    with open(module) as f:
        print("".join(f.readlines()[:3]).rstrip() + "\n...")

    # a fresh interpreter where tracegrad cannot be imported
    blocked = ("import sys, runpy; sys.modules['tracegrad'] = None; "
               f"sys.path[:0] = [{args.out!r}]; sys.argv = ['train_without_tracegrad.py']"
               + (" + ['--small']" if args.small else "") + "; "
               f"runpy.run_path({os.path.join(HERE, 'train_without_tracegrad.py')!r}, "
               "run_name='__main__')")
    print("$ python train_without_tracegrad.py   (with tracegrad blocked)")
    subprocess.run([sys.executable, "-c", blocked], check=True)


if __name__ == "__main__":
    main()
