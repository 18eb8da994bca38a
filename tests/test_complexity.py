"""No function of the package, the operator or the workers is too complex to follow:
radon ranks none of them E or F (cyclomatic complexity above 30)."""

from pathlib import Path

from radon.complexity import cc_rank, cc_visit

ROOT = Path(__file__).resolve().parents[1]
DIRS = ("tailcut", "operator", "workers")
TOO_COMPLEX = ("E", "F")


def _too_complex() -> dict[tuple[str, str], str]:
    """(file, function): "line N, complexity C (rank R)", of every function ranked E or F."""
    found: dict[tuple[str, str], str] = {}
    for top in DIRS:
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            # the blocks `radon cc` lists: functions, classes and their methods (a
            # closure counts in the function around it)
            for block in cc_visit(path.read_text()):
                rank = cc_rank(block.complexity)
                if rank in TOO_COMPLEX:
                    found[(relative, block.fullname)] = (
                        f"line {block.lineno}, complexity {block.complexity} (rank {rank})")
    return found


def test_no_function_ranks_e_or_f() -> None:
    found = _too_complex()
    assert not found, "split these functions (radon cc ranks them E or F):\n" + "\n".join(
        f"{file}:{name}: {said}" for (file, name), said in sorted(found.items()))
