import numpy as np, pytest
from indexers.base import Filters
from indexers.pgvector import PgvectorSource, ensure_indexes
from indexers.postgres import PostgresStore
from tests.integration.test_pgvector import unit_vectors, memory, query, exact_top, open_test_pool, make_config, DIM  # noqa

pytestmark = pytest.mark.anyio

def clustered(rng, centers, n, spread):
    v = centers[rng.integers(0, len(centers), n)] + rng.standard_normal((n, DIM)).astype(np.float32) * spread / np.sqrt(DIM)
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)

@pytest.mark.parametrize("rep", [1, 2])
@pytest.mark.parametrize("spread,k", [(0.5, 100), (0.5, 300), (0.6, 300)])
async def test_cl(postgres, spread, k, rep):
    cfg = make_config()
    pool = await open_test_pool(postgres)
    rng = np.random.default_rng(1)
    n = 20000
    centers = unit_vectors(rng, k)
    vecs = clustered(rng, centers, n, spread)
    rare = rng.random(n) < 0.05
    ids = [f"c-{i}" for i in range(n)]
    t = "t"
    await PostgresStore(pool).write_memories(t, [memory(ids[i], vecs[i], tags=("rare",) if rare[i] else ()) for i in range(n)])
    await ensure_indexes(pool, cfg)
    async with pool.connection() as conn:
        await conn.execute("analyze memories")
    src = PgvectorSource(pool, lambda: cfg)
    rid = [i for i, r in zip(ids, rare) if r]
    qs = clustered(rng, centers, 40, spread)
    rf, lens = [], []
    for q in qs:
        hits = await src.search(query(t, q, filters=Filters(tags=("rare",))))
        lens.append(len(hits))
        rf.append(len({h.id for h in hits} & set(exact_top(rid, vecs[rare], q, 10))))
    print("\nRESULT", spread, k, "filtered", sorted(rf), np.mean(rf), "lens", set(lens))
    await pool.close()
