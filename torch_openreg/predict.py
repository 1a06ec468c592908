"""``python -m torch_openreg.predict script.py --profile h100-sxm [-- script arguments]``

Runs a script on openreg with simulated time on a device profile and prints what the timing model
predicts for the work it launched: the device time, the top operators and what bounds them, the
memory peak against the profile's capacity (the table of ``torch.openreg.simulate``'s report).
"""

from __future__ import annotations

import argparse
import runpy
import sys


# LITERALINCLUDE START: TIMING PREDICT CLI
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_openreg.predict",
                                     description="Predict a script's device time on a device profile.")
    parser.add_argument("script", help="the Python script to run (on openreg)")
    parser.add_argument("--profile", default=None, help="a built-in profile name or a .json/.toml profile file "
                        "(default: OPENREG_DEVICE_PROFILE)")
    parser.add_argument("--top", type=int, default=15, help="operators to list (default 15)")
    parser.add_argument("--roofline", metavar="PNG", help="also save the roofline plot there")
    argv = sys.argv[1:] if argv is None else list(argv)
    ours, script_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    options, unknown = parser.parse_known_args(ours)
    script_args = unknown + script_args  # what follows "--", or what is not ours, is the script's

    import torch

    import openreg

    profile = options.profile or openreg.timing.get_profile()
    if profile is None:
        known = ", ".join(sorted(openreg.timing.profiles()))
        parser.error(f"name a device profile with --profile (known profiles: {known}) or set {openreg.timing.ENV}")
    try:
        simulation = torch.openreg.simulate(profile)
    except openreg.OpenRegError as exc:
        parser.error(str(exc))
    sys.argv = [options.script, *script_args]
    with simulation as report:
        runpy.run_path(options.script, run_name="__main__")
    print(report.table(options.top))
    if options.roofline:
        report.roofline(options.roofline)
        print(f"roofline plot: {options.roofline}")
    return 0
# LITERALINCLUDE END: TIMING PREDICT CLI


if __name__ == "__main__":
    raise SystemExit(main())
