import numpy as np, pytest
from indexers.base import Filters
from indexers.pgvector import PgvectorSource
from tests.integration.test_pgvector import *  # noqa
from tests.integration.test_pgvector import recording_pool, dsn_of, set_search_params

async def test_plan(pool, cfg, corpus):
    await test_session_filter_is_selective_too(pool, cfg, corpus)
    log = []
    sp = await recording_pool(dsn_of(pool), log)
    await PgvectorSource(sp, lambda: cfg).search(query("sessions", corpus.vectors[0], filters=Filters(session_id="s-hot")))
    await sp.close()
    async with pool.connection() as conn, conn.transaction():
        await set_search_params(conn, 32)
        for r in await (await conn.execute("EXPLAIN " + log[0]["statement"], log[0]["params"])).fetchall(): print(r[0][:150])
