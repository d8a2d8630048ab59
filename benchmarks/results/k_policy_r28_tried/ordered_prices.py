"""Round 28's rule R12: the replay harness (benchmarks/k_policy_replay.py) with each batch's verify prices made
non-decreasing in K (adjacent violators pooled, equal weights), everything else as the harness does it. From the
repository root, with the harness's own arguments:
    python benchmarks/results/k_policy_r28_tried/ordered_prices.py --runs RUNS --policy smallest_covering --batch-sizes 1"""
import sys

sys.path.insert(0, "benchmarks")
import k_policy_replay  # noqa: E402


def ordered(prices: list[float]) -> list[float]:
    """The non-decreasing sequence nearest ``prices`` in squared error (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [sum, count]
    for price in prices:
        blocks.append([price, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [total / count for total, count in blocks for _ in range(count)]


real = k_policy_replay.load_for_replay


def load_ordered(pm, run_dir, steady, noise):
    run, cost = real(pm, run_dir, steady, noise)
    verify, memo = cost.verify_s, {}
    ks = sorted(set(run.recipe.k_list()) | {0})

    def verify_ordered(batch, k):
        if batch not in memo:
            memo[batch] = dict(zip(ks, ordered([verify(batch, j) for j in ks])))
        return memo[batch][k] if k in memo[batch] else verify(batch, k)

    cost.verify_s = verify_ordered
    return run, cost


assert ordered([0.83, 1.169, 0.982, 1.458]) == [0.83, (1.169 + 0.982) / 2, (1.169 + 0.982) / 2, 1.458]
k_policy_replay.load_for_replay = load_ordered
sys.argv = [sys.argv[0], *sys.argv[1:]]
k_policy_replay.main()
