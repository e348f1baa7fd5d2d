import numpy as np, pytest
from indexers.base import Filters
from tests.integration.test_pgvector import *  # noqa

pytestmark = pytest.mark.anyio

async def test_recall(pool, cfg, corpus):
    rng = np.random.default_rng(99)
    qs = unit_vectors(rng, 20)
    async with pool.connection() as conn:
        for ef in (32, 100, 400):
            r = []
            for q in qs:
                async with conn.transaction():
                    await conn.execute("select set_config('hnsw.ef_search', %s, true)", (str(ef),))
                    cur = await conn.execute("select id from memories where tier='session' and tenant='big' order by embedding <=> %s limit 10", (q,))
                    got = {x[0] for x in await cur.fetchall()}
                r.append(len(got & set(exact_top(corpus.ids, corpus.vectors, q, 10))))
            print("ef", ef, sorted(r))
        async with conn.transaction():
            await conn.execute("set local enable_indexscan=off")
            cur = await conn.execute("select id from memories where tier='session' and tenant='big' order by embedding <=> %s limit 10", (qs[0],))
            print([x[0] for x in await cur.fetchall()], exact_top(corpus.ids, corpus.vectors, qs[0], 10))
