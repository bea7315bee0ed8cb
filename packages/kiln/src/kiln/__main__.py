"""`python -m kiln <command>`: demo (the main job), report (the compile report), fuzz."""

from __future__ import annotations

import sys

COMMANDS = {
    "demo": "compile a GPT-2-style model on the CPU, check it against eager, print the speed-up",
    "report": "run a script with kiln's logging on and write one HTML compile report",
    "fuzz": "differential fuzzing: random programs compiled with kiln against eager",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in {"-h", "--help"} or argv[0] not in COMMANDS:
        print("usage: python -m kiln <command> [args]\n")
        for name, help_text in COMMANDS.items():
            print(f"  {name:8} {help_text}")
        return 0 if argv and argv[0] in {"-h", "--help"} else 2
    if argv[0] == "demo":
        from kiln.demo import main as demo

        return demo(argv[1:])
    if argv[0] == "fuzz":
        from kiln.fuzz import main as fuzz

        return fuzz(argv[1:])
    from kiln.report import main as report

    return report(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
