import subprocess

REPO = "/app/repo"
MAIN_TIP = "b848ba34043e28c265560723cf07365c79cb5998"
BRANCH = "fix/average"


def git(*args):
    res = subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True)
    assert res.returncode == 0, f"git {' '.join(args)} failed: {res.stderr}"
    return res.stdout


def test_branch_checked_out_and_clean():
    assert git("symbolic-ref", "--short", "HEAD").strip() == BRANCH
    assert git("status", "--porcelain").strip() == ""


def test_single_commit_on_top_of_main():
    assert git("rev-parse", f"{BRANCH}^").strip() == MAIN_TIP
    assert git("rev-list", "--count", f"{MAIN_TIP}..{BRANCH}").strip() == "1"


def test_commit_message():
    assert git("log", "-1", "--format=%B", BRANCH).strip() == "Fix off-by-one in average"


def test_commit_author():
    assert git("log", "-1", "--format=%an <%ae>", BRANCH).strip() == "Dana Fixer <dana@example.com>"


def test_only_calc_changed():
    files = git("diff-tree", "--no-commit-id", "--name-only", "-r", BRANCH).split()
    assert files == ["calc.py"]


def test_average_fixed():
    ns = {}
    exec(git("show", f"{BRANCH}:calc.py"), ns)
    avg, med = ns["average"], ns["median"]
    assert avg([1, 2, 3]) == 2
    assert avg([10]) == 10
    assert abs(avg([2.5, -1, 4, 0.5]) - 1.5) < 1e-9
    try:
        avg([])
        raise AssertionError("average([]) should raise ValueError")
    except ValueError:
        pass
    assert med([3, 1, 2]) == 2 and med([4, 1, 3, 2]) == 2.5


def test_invariant_main_unchanged():
    assert git("rev-parse", "main").strip() == MAIN_TIP
