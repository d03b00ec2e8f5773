def test_hook_connects(publisher_hook, publisher):
    conn = publisher_hook.get_conn()
    with conn.cursor() as cur:
        cur.execute("select current_database(), current_setting('wal_level')")
        assert cur.fetchone() == (publisher.name, "logical")
    conn.close()
