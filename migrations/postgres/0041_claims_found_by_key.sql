-- Claims found by their key when their job is archived (issue 40's
-- distinct-keys workload): columns only, here; 0042 builds the index that
-- replaces the claims' job_id index, 0043 drops that index and has the
-- functions write and read the columns.
--
-- A claim was given back by the archive's trigger through an index on the
-- claimant's id, whose entry cost every claim about a fifth of its insert
-- (3.3 ms of 14.6 per 5,000 claims, BENCHMARKS.md, "Fourth pass"). A job a
-- host enqueues now carries its `until_executed` key on its own row, from
-- `jobs` through `blocked_jobs` to the archive, and the trigger deletes
-- its claim by the claims' primary key. Such a claim is `attached`: its job's
-- row holds its key. Every other claim (taken by the SQL enqueue, a retry
-- from the archive, a run's `while_executing` key, a host of the previous
-- release, and every claim taken before this migration) is not, and is
-- found by its job id through a partial index of the unattached claims
-- alone.
--
-- `archive.key_carried` says that the statement which archived a row
-- carried the key across (the functions of 0043 and the host's own
-- statements set it): the row's key, or its lack of one, is the truth. A
-- row archived by a statement of the previous release, which names no
-- such column, has it false, and its claim is looked for by a scan of the
-- attached claims: slow, but only while such hosts run.
--
-- Each column is added without a rewrite (a constant default or none).
ALTER TABLE jobhost.unique_claims ADD COLUMN attached boolean NOT NULL DEFAULT false;
ALTER TABLE jobhost.jobs ADD COLUMN unique_key text;
ALTER TABLE jobhost.blocked_jobs ADD COLUMN unique_key text;
ALTER TABLE jobhost.archive
    ADD COLUMN unique_key text,
    ADD COLUMN key_carried boolean NOT NULL DEFAULT false;
