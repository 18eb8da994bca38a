"""How the flat parameter vector is cut among the PS shards. Pure: tailcut.plan (through
the flow report) sizes each shard's flows without loading the roles."""


def shard_range(num_params: int, num_shards: int, shard: int) -> tuple[int, int]:
    """[lo, hi) of the flat vector that ``shard`` owns: contiguous, sizes differ by <= 1."""
    size, extra = divmod(num_params, num_shards)
    lo = shard * size + min(shard, extra)
    return lo, lo + size + (1 if shard < extra else 0)
