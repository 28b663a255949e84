-- Uniqueness: at most one job of a type per rendered key, either from
-- enqueue until the job leaves the queue for good (until_executed) or
-- while it runs (while_executing).
--
-- Two tables, both keyed so that no path that moves a job can lose them:
-- jobhost.unique_keys holds the rendered key of every live unique job by
-- job id (a blocked job moves between jobhost.jobs and
-- jobhost.blocked_jobs, a retrying one between states; its key stays), and
-- jobhost.unique_claims holds who has each (type, key) now. Claims are only
-- ever taken with INSERT ... ON CONFLICT DO NOTHING, so two enqueuers or two
-- fetchers of one key serialize on the primary key and exactly one wins.
--
-- Release is by construction, in the transaction that ends the job or the
-- run: a trigger on the archive gives back everything of an archived job,
-- whichever path archived it (a result, an expiry, a cancel, a discard, a
-- quarantine); a trigger on a run's lease token gives back a
-- while_executing claim only when the token it is bound to goes, so a
-- stale or duplicate result (which matches no current token and changes no
-- row) releases nothing, and a successor's claim is never touched.

CREATE TABLE jobhost.unique_keys (
    job_id          bigint  PRIMARY KEY,
    job             text    NOT NULL,
    unique_key      text    NOT NULL CHECK (octet_length(unique_key) <= 1024),
    while_executing boolean NOT NULL
);

CREATE TABLE jobhost.unique_claims (
    job        text        NOT NULL,
    unique_key text        NOT NULL,
    -- The claimant: the job enqueued first (until_executed) or running now.
    job_id     bigint      NOT NULL,
    -- The run a while_executing claim is bound to; null for until_executed.
    lease_token bigint,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job, unique_key)
);

CREATE INDEX unique_claims_job_id ON jobhost.unique_claims (job_id);

-- Everything of jobs that reached the archive, once per statement: a
-- finish of a thousand results costs one call, and one join against tables
-- that are empty unless unique job types are in use.
CREATE FUNCTION jobhost.release_unique_archived() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM jobhost.unique_claims c USING archived a WHERE c.job_id = a.id;
    DELETE FROM jobhost.unique_keys k USING archived a WHERE k.job_id = a.id;
    RETURN NULL;
END;
$$;

CREATE TRIGGER archive_releases_unique AFTER INSERT ON jobhost.archive
    REFERENCING NEW TABLE AS archived
    FOR EACH STATEMENT EXECUTE FUNCTION jobhost.release_unique_archived();

-- A run ended without archiving its job (a retry, a snooze, an expired
-- lease, a hand-back): its while_executing claim goes, if the claim is
-- still bound to that run's token.
CREATE FUNCTION jobhost.release_unique_run() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM jobhost.unique_claims c WHERE c.job_id = OLD.id AND c.lease_token = OLD.lease_token;
    RETURN NULL;
END;
$$;

-- The WHEN is evaluated without calling the function, so runs that end
-- with their job archived (the common case: a DELETE) never pay for it, and
-- a requeue pays one probe of an index.
CREATE TRIGGER jobs_release_unique_run AFTER UPDATE OF lease_token ON jobhost.jobs
    FOR EACH ROW
    WHEN (OLD.lease_token IS NOT NULL AND OLD.lease_token IS DISTINCT FROM NEW.lease_token)
    EXECUTE FUNCTION jobhost.release_unique_run();

-- Claims (type, key) for new jobs whose ids the caller chose, in (type,
-- key, id) order so two enqueuers of overlapping keys never deadlock.
-- Returns, for each input position, the claimant: the input's own id when
-- it won, another job's when the key was claimed already (or earlier in
-- this same input). The claimants are read in one statement, and a claim
-- released between the refused insert and that read is taken again, so
-- every position has a claimant.
-- Locks: the claims' primary key entries; an enqueuer of a key another
-- uncommitted transaction has just claimed waits for it to end.
CREATE FUNCTION jobhost.claim_unique(job_types text[], unique_keys text[], job_ids bigint[])
RETURNS TABLE (ord bigint, claimant bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    holders bigint[];
    held integer;
    tries integer := 0;
BEGIN
    LOOP
        INSERT INTO jobhost.unique_claims (job, unique_key, job_id)
        SELECT u.job, u.unique_key, u.id
        FROM unnest(job_types, unique_keys, job_ids) AS u(job, unique_key, id)
        ORDER BY u.job, u.unique_key, u.id
        ON CONFLICT DO NOTHING;
        SELECT array_agg(c.job_id ORDER BY u.n), count(c.job_id) INTO holders, held
        FROM unnest(job_types, unique_keys) WITH ORDINALITY AS u(job, unique_key, n)
        LEFT JOIN jobhost.unique_claims c ON c.job = u.job AND c.unique_key = u.unique_key;
        EXIT WHEN held = cardinality(job_types);
        tries := tries + 1;
        IF tries >= 100 THEN
            RAISE EXCEPTION 'uniqueness keys kept being released while they were claimed' USING ERRCODE = '40001';
        END IF;
    END LOOP;
    RETURN QUERY SELECT h.n, h.holder FROM unnest(holders) WITH ORDINALITY AS h(holder, n);
END;
$$;

-- The fetch (first in 0003_fetch_function), now also taking the claim of
-- each while_executing job it leases, bound to the new lease token. A job
-- whose key another run holds is passed over (it stays available, in
-- place) so the jobs behind it still run; of two fetchers racing for one
-- key's jobs, the second waits on the first's claim, finds it taken and
-- leases the rest. JIT is off: the claims' sort, priced as forbidden by
-- enable_sort, would push the plan's cost past jit_above_cost, and compiling
-- it takes a second where running it takes a fraction of a millisecond.
CREATE OR REPLACE FUNCTION jobhost.fetch(
    queues text[],
    job_types text[],
    lease_secs integer[],
    max_jobs bigint,
    host text
) RETURNS SETOF jobhost.jobs
LANGUAGE plpgsql
SET enable_sort = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    WITH picked AS (
        SELECT j.id, j.job
        FROM jobhost.jobs j
        WHERE j.state = 'available'
          AND j.queue = ANY(queues)
          AND j.job = ANY(job_types)
          AND NOT EXISTS (
              SELECT 1
              FROM jobhost.unique_keys k
              JOIN jobhost.unique_claims c ON c.job = k.job AND c.unique_key = k.unique_key
              WHERE k.job_id = j.id AND k.while_executing)
        ORDER BY j.priority, j.run_at, j.id
        LIMIT max_jobs
        FOR UPDATE OF j SKIP LOCKED
    ),
    tokens AS (
        SELECT p.id, p.job, nextval('jobhost.lease_tokens') AS token FROM picked p
    ),
    exclusive AS (
        SELECT t.id, t.token, k.job, k.unique_key
        FROM tokens t
        JOIN jobhost.unique_keys k ON k.job_id = t.id AND k.while_executing
    ),
    claimed AS (
        INSERT INTO jobhost.unique_claims (job, unique_key, job_id, lease_token)
        SELECT e.job, e.unique_key, e.id, e.token FROM exclusive e
        ORDER BY e.job, e.unique_key, e.id
        ON CONFLICT DO NOTHING
        RETURNING job_id
    ),
    leases AS (
        SELECT t.id, t.token, s.lease_secs
        FROM tokens t
        JOIN unnest(job_types, lease_secs) AS s(job, lease_secs) ON s.job = t.job
        WHERE t.id NOT IN (SELECT e.id FROM exclusive e)
           OR t.id IN (SELECT c.job_id FROM claimed c)
    )
    UPDATE jobhost.jobs j
    SET state = 'running',
        attempt = j.attempt + 1,
        lease_token = l.token,
        lease_secs = l.lease_secs,
        lease_expires_at = now() + l.lease_secs * interval '1 second',
        host_id = host,
        started_at = now()
    FROM leases l
    WHERE j.id = l.id
    RETURNING j.*;
END;
$$;

-- on_duplicate 'replace': the claimant takes a duplicate's payload while it
-- waits (scheduled or available). Unlimited, it takes the duplicate's time
-- to run too. Limited, it keeps its time and its place at the gate (an
-- available one holds a slot; a scheduled one passes the gate when it comes
-- due), so it takes the payload only, and only when its concurrency key
-- stays the same: a replace never runs the gate, so it never blocks,
-- discards or refuses anything. Running or blocked, it is left alone.
-- Returns whether it was replaced.
CREATE FUNCTION jobhost.replace_waiting(claimant bigint, new_payload jsonb, due timestamptz, new_key text)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE jobhost.jobs j
    SET payload = new_payload,
        run_at = greatest(due, now()),
        state = CASE WHEN due > now() THEN 'scheduled' ELSE 'available' END
    WHERE j.id = claimant AND j.state IN ('scheduled', 'available')
      AND j.concurrency_key IS NULL AND new_key IS NULL;
    IF FOUND THEN
        IF due <= now() THEN
            PERFORM pg_notify('jobhost_available', '');
        END IF;
        RETURN true;
    END IF;
    UPDATE jobhost.jobs j SET payload = new_payload
    WHERE j.id = claimant AND j.state IN ('scheduled', 'available') AND j.concurrency_key = new_key;
    RETURN FOUND;
END;
$$;

-- The SQL enqueue (first in 0002, last restated in 0005), now with the
-- uniqueness rules of the host's enqueue: a duplicate of an
-- until_executed key returns the claimant's id (skip and replace) or
-- raises SQLSTATE JHU01 (raise), storing nothing.
CREATE OR REPLACE FUNCTION jobhost.enqueue(
    job text,
    payload jsonb,
    queue text DEFAULT NULL,
    priority smallint DEFAULT NULL,
    run_at timestamptz DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    config jsonb;
    new_id bigint;
    claimant bigint;
    due timestamptz := greatest(coalesce(run_at, now()), now());
    chosen_queue text;
    concurrency_key text;
    unique_key text;
    while_executing boolean;
    on_duplicate text;
    payload_bytes bigint;
    -- The database's setting, like the host's --max-payload (1 MiB unless set).
    max_payload_bytes bigint :=
        coalesce(nullif(current_setting('jobhost.max_payload_bytes', true), '')::bigint, 1048576);
BEGIN
    SELECT t.config INTO config FROM jobhost.job_types t WHERE t.name = job;
    IF config IS NULL THEN
        RAISE EXCEPTION 'unknown job type "%": no host has loaded a component for it', job USING ERRCODE = '22023';
    END IF;
    IF payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN
        RAISE EXCEPTION 'payload of job "%" must be a JSON object', job USING ERRCODE = '22023';
    END IF;
    payload_bytes := octet_length(payload::text);
    IF payload_bytes > max_payload_bytes THEN
        RAISE EXCEPTION 'payload of job "%" is % bytes of JSON, more than the largest accepted, % bytes',
            job, payload_bytes, max_payload_bytes USING ERRCODE = '22023';
    END IF;
    chosen_queue := coalesce(queue, config ->> 'queue');
    IF chosen_queue !~ '^[a-z0-9_.-]{1,128}$' THEN
        RAISE EXCEPTION 'queue "%" must be 1 to 128 characters of a-z, 0-9, _, . and -', chosen_queue
            USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(config -> 'concurrency') = 'object' THEN
        concurrency_key := jobhost.render_key(config -> 'concurrency' ->> 'key', payload);
    END IF;
    new_id := nextval('jobhost.job_ids');
    IF jsonb_typeof(config -> 'unique') = 'object' THEN
        unique_key := jobhost.render_key(config -> 'unique' ->> 'key', payload);
        while_executing := config -> 'unique' ->> 'strategy' = 'while_executing';
        on_duplicate := coalesce(config -> 'unique' ->> 'on_duplicate', 'skip');
        IF NOT while_executing THEN
            SELECT c.claimant INTO claimant
            FROM jobhost.claim_unique(ARRAY[job], ARRAY[unique_key], ARRAY[new_id]) c;
            IF claimant IS DISTINCT FROM new_id THEN
                IF on_duplicate = 'raise' THEN
                    RAISE EXCEPTION 'job "%" with unique key "%" is a duplicate of job %', job, unique_key, claimant
                        USING ERRCODE = 'JHU01';
                ELSIF on_duplicate = 'replace' THEN
                    PERFORM jobhost.replace_waiting(claimant, payload, due, concurrency_key);
                END IF;
                RETURN claimant;
            END IF;
        END IF;
    END IF;
    INSERT INTO jobhost.jobs (id, job, queue, priority, payload, state, max_attempts, run_at, concurrency_key)
    VALUES (
        new_id,
        job,
        chosen_queue,
        coalesce(priority, (config ->> 'priority')::smallint),
        payload,
        CASE WHEN due > now() THEN 'scheduled' ELSE 'available' END,
        (config ->> 'max_attempts')::integer,
        due,
        concurrency_key
    );
    IF unique_key IS NOT NULL THEN
        INSERT INTO jobhost.unique_keys (job_id, job, unique_key, while_executing)
        VALUES (new_id, job, unique_key, while_executing);
    END IF;
    IF due <= now() THEN
        PERFORM jobhost.admit(ARRAY[new_id], true);
    END IF;
    RETURN new_id;
END;
$$;

-- A job an operator brings back from the archive (`jobhost retry`) takes
-- its uniqueness key again, rendered by its type's current configuration,
-- as a new enqueue would: while another job holds the key, the retry is
-- refused (SQLSTATE JHU01) and the job stays in the archive.
CREATE FUNCTION jobhost.reclaim_unique(revived_id bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    job_type text;
    job_payload jsonb;
    config jsonb;
    key text;
    while_executing boolean;
    claimant bigint;
BEGIN
    SELECT j.job, j.payload INTO job_type, job_payload FROM jobhost.jobs j WHERE j.id = revived_id;
    SELECT t.config INTO config FROM jobhost.job_types t WHERE t.name = job_type;
    IF jsonb_typeof(config -> 'unique') IS DISTINCT FROM 'object' THEN
        RETURN;
    END IF;
    key := jobhost.render_key(config -> 'unique' ->> 'key', job_payload);
    while_executing := config -> 'unique' ->> 'strategy' = 'while_executing';
    INSERT INTO jobhost.unique_keys (job_id, job, unique_key, while_executing)
    VALUES (revived_id, job_type, key, while_executing);
    IF while_executing THEN
        RETURN;
    END IF;
    SELECT c.claimant INTO claimant FROM jobhost.claim_unique(ARRAY[job_type], ARRAY[key], ARRAY[revived_id]) c;
    IF claimant IS DISTINCT FROM revived_id THEN
        RAISE EXCEPTION 'job % cannot be retried while job % holds its unique key "%"', revived_id, claimant, key
            USING ERRCODE = 'JHU01';
    END IF;
END;
$$;
