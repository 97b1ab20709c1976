"""`distill train | cache-teacher | accept | bench | publish | demo | ...`: each verb is a module's main().

`distill VERB --help` is answered from `distill.arguments` before the verb's module (and torch) loads, and
`distill train --help-recipe` from the recipe's declarations (distill.training.recipe) alone."""

from __future__ import annotations

import importlib
import sys

from distill.arguments import COMMANDS, parser, quiet_cpu_deepspeed


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the verb's module; `distill` alone runs the demo, the embedded default."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print("usage: distill {" + ",".join(COMMANDS) + "} [options]\n")
        for name, (_, text, _) in COMMANDS.items():
            print(f"  {name:<14} {text}")
        return 0
    verb = argv.pop(0) if argv and not argv[0].startswith("-") else "demo"
    if verb not in COMMANDS:
        print(f"distill: unknown command {verb!r}; choose one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    if "-h" in argv or "--help" in argv:
        parser(verb).parse_args(argv)  # prints the help and exits
    if verb == "train" and "--help-recipe" in argv:
        from distill.training.recipe import recipe_help  # the declarations alone: no torch

        print(recipe_help())
        return 0
    quiet_cpu_deepspeed()
    module = importlib.import_module(COMMANDS[verb][0])
    return int(module.main(argv) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
