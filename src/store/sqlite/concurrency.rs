//! Per-key concurrency in SQLite: the gate, the release, the sweep and the
//! repair, with the same rules as the PostgreSQL functions in
//! src/store/postgres/functions/ (`take_slot`, `release_slots`,
//! `promotable_keys`, `repair_semaphores`).
//!
//! The invariant: a job with a concurrency key holds one slot of its
//! (job, key) semaphore exactly while it is in `jobs` as available or
//! running. Every function here runs inside the caller's `BEGIN IMMEDIATE`
//! transaction: with the file's write lock held from the first statement,
//! a count read here stays true until the commit, so read-then-write is
//! safe and needs no row locks.

use std::collections::BTreeMap;

use async_trait::async_trait;
use sqlx::{SqliteConnection, SqlitePool};

use super::SqliteStore;
use super::encode::now_ms;
use super::{iso, json_list};
use crate::store::concurrency::{BlockedKey, BlockedSweep, key_page_cut, key_page_read, key_page_start};
use crate::store::driver::SemaphoreDriver;
use crate::store::{Error, Holder, KeyCursor, KeyPage, KeyStatus, Result, SemaphoreFix, Slots};

/// A key's holders and its type's limit. The limit is unlimited when the
/// type no longer declares one, so jobs keyed under an old version still
/// count their slots but are never held back.
struct KeyState {
    holders: i64,
    limit: i64,
}

async fn key_state(conn: &mut SqliteConnection, job: &str, key: &str) -> Result<KeyState> {
    let (holders, limit): (i64, Option<i64>) = sqlx::query_as(
        "SELECT coalesce((SELECT holders FROM semaphores WHERE job = $1 AND key = $2), 0),
                json_extract(t.config, '$.concurrency.limit')
         FROM (SELECT 1) LEFT JOIN job_types t ON t.name = $1",
    )
    .bind(job)
    .bind(key)
    .fetch_one(&mut *conn)
    .await?;
    Ok(KeyState { holders, limit: limit.unwrap_or(i64::from(i32::MAX)) })
}

/// A key as the gate reads it (`sql/gate_states.sql`): its holders, its
/// type's limit (none when the type no longer declares one: unlimited) and
/// `on_conflict` (none: block).
struct GateKey {
    job: String,
    key: String,
    holders: i64,
    limit: Option<i64>,
    on_conflict: Option<String>,
}

from_row!(sqlx::sqlite::SqliteRow, GateKey { job, key, holders, limit, on_conflict });

/// Records a key's holder count, deleting the row when none is left.
async fn set_holders(conn: &mut SqliteConnection, job: &str, key: &str, holders: i64, now: i64) -> Result<()> {
    if holders == 0 {
        sqlx::query("DELETE FROM semaphores WHERE job = $1 AND key = $2").bind(job).bind(key).execute(conn).await?;
    } else {
        sqlx::query(
            "INSERT INTO semaphores (job, key, holders, updated_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (job, key) DO UPDATE SET holders = excluded.holders, updated_at = excluded.updated_at",
        )
        .bind(job)
        .bind(key)
        .bind(holders)
        .bind(now)
        .execute(conn)
        .await?;
    }
    Ok(())
}

/// THE GATE. Decides the jobs (rows of `jobs`, new or come due) that are to
/// become runnable now. A job without a key becomes available. For each
/// key, its free slots (limit minus holders) go to its jobs in priority
/// then arrival order; the rest meet the type's `on_conflict`: `block`
/// blocks them, `discard` archives them as discarded, `raise` fails the
/// caller's transaction with [`Error::LimitReached`] when an enqueuer is
/// waiting for the answer, and discards them otherwise (a delayed job coming
/// due has nobody to tell). Returns how many jobs became available.
///
/// Set-based: at most nine statements however many keys the jobs have
/// (each statement is a hop to the connection's thread, and a bulk enqueue
/// brings thousands of keys).
pub async fn admit(conn: &mut SqliteConnection, ids: &[i64], enqueuer_waiting: bool, now: i64) -> Result<u64> {
    let list = json_list(ids);
    let unkeyed = sqlx::query(
        "UPDATE jobs SET state = 'available'
         WHERE id IN (SELECT value FROM json_each($1)) AND concurrency_key IS NULL",
    )
    .bind(&list)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    let keyed: Vec<(i64, String, String)> = sqlx::query_as(
        "SELECT id, job, concurrency_key FROM jobs
         WHERE id IN (SELECT value FROM json_each($1)) AND concurrency_key IS NOT NULL
         ORDER BY job, concurrency_key, priority, run_at, id",
    )
    .bind(&list)
    .fetch_all(&mut *conn)
    .await?;
    if keyed.is_empty() {
        return Ok(unkeyed);
    }
    let mut keys: BTreeMap<(String, String), Vec<i64>> = BTreeMap::new();
    for (id, job, key) in keyed {
        keys.entry((job, key)).or_default().push(id);
    }
    let verdict = decide(conn, &keys, enqueuer_waiting).await?;
    record_holders(conn, &verdict.holders, now).await?;
    if !verdict.available.is_empty() {
        sqlx::query("UPDATE jobs SET state = 'available' WHERE id IN (SELECT value FROM json_each($1))")
            .bind(json_list(&verdict.available))
            .execute(&mut *conn)
            .await?;
    }
    discard(conn, &verdict.discarded, now).await?;
    block(conn, &verdict.blocked, now).await?;
    Ok(unkeyed + verdict.available.len() as u64)
}

/// What the gate decided for a set of keys, before anything is written.
#[derive(Default)]
pub struct Verdict<'a> {
    /// Each key that takes slots, with its holders after taking them.
    pub holders: Vec<(&'a str, &'a str, i64)>,
    /// The jobs that got a slot.
    pub available: Vec<i64>,
    /// The jobs to block.
    pub blocked: Vec<i64>,
    /// The jobs to archive as discarded, each with its key's reason.
    pub discarded: Vec<(i64, String)>,
}

/// The gate's decision for `keys` (each (job, key) with its jobs in
/// priority then arrival order), from one read of the keys' holders and
/// their types' rules; writes nothing, so a `raise` refuses before anything
/// is written (the first full key in key order).
pub async fn decide<'a>(
    conn: &mut SqliteConnection,
    keys: &'a BTreeMap<(String, String), Vec<i64>>,
    enqueuer_waiting: bool,
) -> Result<Verdict<'a>> {
    let wanted: Vec<(&str, &str)> = keys.keys().map(|(job, key)| (job.as_str(), key.as_str())).collect();
    let states: Vec<GateKey> =
        sqlx::query_as(include_str!("sql/gate_states.sql")).bind(json_list(&wanted)).fetch_all(&mut *conn).await?;
    if states.len() != keys.len() {
        return Err(Error::Decode(format!("the gate read {} of {} keys", states.len(), keys.len())));
    }
    let mut verdict = Verdict::default();
    for GateKey { job, key, holders: held, limit, on_conflict } in states {
        let read = (job, key);
        let Some(((job, key), ids)) = keys.get_key_value(&read) else {
            let (job, key) = read;
            return Err(Error::Decode(format!("the gate read key {key:?} of {job:?}, which it did not ask for")));
        };
        let limit = limit.unwrap_or(i64::from(i32::MAX));
        let taken = (limit - held).clamp(0, ids.len() as i64) as usize;
        if taken > 0 {
            verdict.holders.push((job, key, held + taken as i64));
            verdict.available.extend_from_slice(&ids[..taken]);
        }
        let refused = &ids[taken..];
        if refused.is_empty() {
            continue;
        }
        let reason = format!("concurrency limit reached: all {limit} slots of key \"{key}\" are taken");
        match on_conflict.as_deref() {
            Some("raise") if enqueuer_waiting => {
                return Err(Error::LimitReached(format!("job \"{job}\" refused: {reason}")));
            }
            Some("discard" | "raise") => verdict.discarded.extend(refused.iter().map(|id| (*id, reason.clone()))),
            _ => verdict.blocked.extend_from_slice(refused),
        }
    }
    Ok(verdict)
}

/// Records the holders of keys that have some, in one statement.
pub async fn record_holders(conn: &mut SqliteConnection, holders: &[(&str, &str, i64)], now: i64) -> Result<()> {
    if holders.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO semaphores (job, key, holders, updated_at)
         SELECT value ->> 0, value ->> 1, value ->> 2, $2 FROM json_each($1) WHERE true
         ON CONFLICT (job, key) DO UPDATE SET holders = excluded.holders, updated_at = excluded.updated_at",
    )
    .bind(json_list(holders))
    .bind(now)
    .execute(conn)
    .await?;
    Ok(())
}

/// Moves jobs to `blocked_jobs`, keeping each payload document as it is.
async fn block(conn: &mut SqliteConnection, ids: &[i64], now: i64) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let list = json_list(ids);
    sqlx::query(
        "INSERT INTO blocked_jobs (id, job, queue, priority, payload, attempt, max_attempts, enqueued_at, started_at,
                                   concurrency_key, batch_id, parent_id, errors, progress, parked_at)
         SELECT id, job, queue, priority, payload, attempt, max_attempts, enqueued_at, started_at,
                concurrency_key, batch_id, parent_id, errors, progress, $2
         FROM jobs WHERE id IN (SELECT value FROM json_each($1))",
    )
    .bind(&list)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    sqlx::query("DELETE FROM jobs WHERE id IN (SELECT value FROM json_each($1))").bind(&list).execute(conn).await?;
    Ok(())
}

/// Archives jobs as discarded, each with its reason (`[id, reason]`).
async fn discard(conn: &mut SqliteConnection, jobs: &[(i64, String)], now: i64) -> Result<()> {
    if jobs.is_empty() {
        return Ok(());
    }
    let list = json_list(jobs);
    sqlx::query(
        "INSERT INTO archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors, progress,
                              enqueued_at, started_at, finished_at, concurrency_key, batch_id, parent_id)
         SELECT j.id, j.job, j.queue, j.priority, j.payload, 'discarded', j.attempt, j.max_attempts,
                json_insert(j.errors, '$[#]', json_object('attempt', j.attempt, 'at', $2, 'error', r.value ->> 1)),
                j.progress, j.enqueued_at, j.started_at, $3, j.concurrency_key, j.batch_id, j.parent_id
         FROM json_each($1) r JOIN jobs j ON j.id = r.value ->> 0",
    )
    .bind(&list)
    .bind(iso(now))
    .bind(now)
    .execute(&mut *conn)
    .await?;
    sqlx::query("DELETE FROM jobs WHERE id IN (SELECT value ->> 0 FROM json_each($1))")
        .bind(&list)
        .execute(conn)
        .await?;
    Ok(())
}

/// Gives back one slot per entry of `slots` and hands the freed slots to
/// blocked jobs, in the transaction that ended the holders' hold (guarantees
/// 1, 4 and 7). Returns how many blocked jobs it promoted.
pub async fn release(conn: &mut SqliteConnection, slots: &Slots, now: i64) -> Result<u64> {
    let mut freed: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    for slot in slots.iter() {
        *freed.entry(slot).or_default() += 1;
    }
    let keys: Vec<(&str, &str, i64)> = freed.into_iter().map(|((job, key), n)| (job, key, n)).collect();
    fill_keys(conn, &keys, now).await
}

/// Gives back `freed` slots of one key (zero for a sweep), then promotes
/// blocked jobs into whatever slots are free. Returns how many it promoted.
pub async fn fill(conn: &mut SqliteConnection, job: &str, key: &str, freed: i64, now: i64) -> Result<u64> {
    fill_keys(conn, &[(job, key, freed)], now).await
}

/// Gives back slots of many keys at once (`(job, key, freed)`), promotes
/// blocked jobs, highest priority then oldest, into whatever slots each key
/// has free, and records the holders. Returns how many it promoted. At most
/// five statements however many keys a write frees: each statement is a hop
/// to the connection's thread, and one result write can free a key per result.
async fn fill_keys(conn: &mut SqliteConnection, keys: &[(&str, &str, i64)], now: i64) -> Result<u64> {
    if keys.is_empty() {
        return Ok(0);
    }
    let states: Vec<(String, String, i64, i64, Option<i64>)> =
        sqlx::query_as(include_str!("sql/release_states.sql")).bind(json_list(keys)).fetch_all(&mut *conn).await?;
    // Per key: the holders recorded, those left once the freed slots are
    // back, and the slots free for blocked jobs.
    let mut left: BTreeMap<(String, String), (i64, i64)> = BTreeMap::new();
    let mut wanted: Vec<(&str, &str, i64)> = Vec::new();
    for (job, key, freed, recorded, limit) in &states {
        let remaining = (recorded - freed).max(0);
        let free = (limit.unwrap_or(i64::from(i32::MAX)) - remaining).max(0);
        if free > 0 {
            wanted.push((job, key, free));
        }
        left.insert((job.clone(), key.clone()), (*recorded, remaining));
    }
    let mut promoted = 0;
    if !wanted.is_empty() {
        let moved: Vec<(i64, String, String)> = sqlx::query_as(include_str!("sql/release_promote.sql"))
            .bind(json_list(&wanted))
            .bind(now)
            .fetch_all(&mut *conn)
            .await?;
        if !moved.is_empty() {
            let ids: Vec<i64> = moved.iter().map(|(id, _, _)| *id).collect();
            sqlx::query("DELETE FROM blocked_jobs WHERE id IN (SELECT value FROM json_each($1))")
                .bind(json_list(&ids))
                .execute(&mut *conn)
                .await?;
        }
        promoted = moved.len() as u64;
        for (_, job, key) in moved {
            if let Some((_, holders)) = left.get_mut(&(job, key)) {
                *holders += 1;
            }
        }
    }
    let mut changed: Vec<(&str, &str, i64)> = Vec::new();
    let mut emptied: Vec<(&str, &str)> = Vec::new();
    for ((job, key), (recorded, holders)) in &left {
        if *holders == 0 {
            emptied.push((job, key));
        } else if holders != recorded {
            changed.push((job, key, *holders));
        }
    }
    record_holders(conn, &changed, now).await?;
    if !emptied.is_empty() {
        sqlx::query(
            "DELETE FROM semaphores
             WHERE (job, key) IN (SELECT value ->> 0, value ->> 1 FROM json_each($1))",
        )
        .bind(json_list(&emptied))
        .execute(&mut *conn)
        .await?;
    }
    Ok(promoted)
}

/// The next `max_keys` keys with blocked jobs after `after`, in (job, key)
/// order, each with whether it could take a slot now, and where the next
/// page goes on. A page, read one index probe per key however many jobs each
/// has blocked; a sweep that follows it visits every key in turn, so a
/// crowd of full keys cannot starve one with a free slot (guarantee 4).
#[async_trait::async_trait]
impl BlockedSweep for super::SqliteStore {
    async fn blocked_keys_page(&self, after: Option<&KeyCursor>, max_keys: i64) -> Result<KeyPage<Vec<BlockedKey>>> {
        let (after_job, after_key) = key_page_start(after);
        let keys: Vec<(String, String, bool)> = sqlx::query_as(include_str!("sql/promotable_keys.sql"))
            .bind(after_job)
            .bind(after_key)
            .bind(key_page_read(max_keys))
            .fetch_all(&self.reader)
            .await?;
        let (keys, next) = key_page_cut(keys, max_keys, |(job, key, _)| (job.clone(), key.clone()));
        let done = keys.into_iter().map(|(job, key, promotable)| BlockedKey { job, key, promotable }).collect();
        Ok(KeyPage { done, next })
    }

    /// One transaction per key keeps each hold of the write lock short.
    async fn promote_key(&self, job: &str, key: &str) -> Result<u64> {
        let mut tx = self.write().await?;
        let moved = fill(&mut tx, job, key, 0, super::now_ms()).await?;
        tx.commit().await?;
        self.announce(moved > 0);
        Ok(moved)
    }
}

/// The keys with blocked jobs of some job types, for promotion after their
/// limits changed.
pub async fn blocked_keys_of(conn: &mut SqliteConnection, job_types: &[String]) -> Result<Vec<(String, String)>> {
    Ok(sqlx::query_as(
        "SELECT DISTINCT job, concurrency_key FROM blocked_jobs
         WHERE job IN (SELECT value FROM json_each($1)) ORDER BY 1, 2",
    )
    .bind(json_list(job_types))
    .fetch_all(conn)
    .await?)
}

pub async fn free_slots(conn: &mut SqliteConnection, job: &str, key: &str) -> Result<i64> {
    let state = key_state(conn, job, key).await?;
    Ok(state.limit - state.holders)
}

/// Sets the holder count of each semaphore of the next `max_keys` keys
/// after `after` (keys with a semaphore row or live holders) to the number
/// of live jobs holding its slots where the two disagree (after rows were
/// changed or deleted by hand), recreating missing rows, then promotes
/// blocked jobs into any slot a fix freed. A page, so the write lock is held
/// for a bounded time. Returns what it changed and where the next page goes on.
pub async fn repair(
    conn: &mut SqliteConnection,
    after: Option<&KeyCursor>,
    max_keys: i64,
    now: i64,
) -> Result<KeyPage<Vec<SemaphoreFix>>> {
    let (after_job, after_key) = key_page_start(after);
    let end: Option<(String, String, bool)> = sqlx::query_as(include_str!("sql/semaphore_page_end.sql"))
        .bind(after_job)
        .bind(after_key)
        .bind(max_keys)
        .fetch_optional(&mut *conn)
        .await?;
    let Some((last_job, last_key, more)) = end else {
        return Ok(KeyPage { done: Vec::new(), next: None });
    };
    let fixes: Vec<(String, String, i64, i64)> = sqlx::query_as(include_str!("sql/semaphore_repair.sql"))
        .bind(after_job)
        .bind(after_key)
        .bind(&last_job)
        .bind(&last_key)
        .fetch_all(&mut *conn)
        .await?;
    for (job, key, _, actual) in &fixes {
        set_holders(conn, job, key, *actual, now).await?;
        fill(conn, job, key, 0, now).await?;
    }
    Ok(KeyPage {
        done: fixes
            .into_iter()
            .map(|(job, key, recorded, actual)| SemaphoreFix {
                job,
                key,
                recorded: recorded as i32,
                actual: actual as i32,
            })
            .collect(),
        next: more.then_some((last_job, last_key)),
    })
}

pub async fn status(pool: &SqlitePool, now: i64) -> Result<Vec<KeyStatus>> {
    let rows: Vec<KeyRow> = sqlx::query_as(include_str!("sql/semaphore_list.sql")).bind(now).fetch_all(pool).await?;
    rows.into_iter()
        .map(|KeyRow { job, key, limit, holders, holding, blocked, oldest }| {
            let holding: Vec<Holder> = serde_json::from_str(&holding)
                .map_err(|e| Error::Decode(format!("unreadable holders of key {key}: {e}")))?;
            Ok(KeyStatus {
                job,
                key,
                limit: limit.map(|l| l as i32),
                holders: holders as i32,
                holding,
                blocked,
                oldest_blocked_secs: oldest.map(|s| s.max(0.0)),
            })
        })
        .collect()
}

/// One row of [`status`].
struct KeyRow {
    job: String,
    key: String,
    limit: Option<i64>,
    holders: i64,
    holding: String,
    blocked: i64,
    oldest: Option<f64>,
}

from_row!(sqlx::sqlite::SqliteRow, KeyRow { job, key, limit, holders, holding, blocked, oldest });

#[async_trait]
impl SemaphoreDriver for SqliteStore {
    async fn semaphore_repair_page(
        &self,
        after: Option<&KeyCursor>,
        max_keys: i64,
    ) -> Result<KeyPage<Vec<SemaphoreFix>>> {
        self.write_with(async |tx| repair(tx, after, max_keys, now_ms()).await).await
    }

    async fn semaphore_list(&self) -> Result<Vec<KeyStatus>> {
        status(&self.reader, now_ms()).await
    }

    async fn semaphore_free_slots(&self, job: &str, key: &str) -> Result<i64> {
        let mut conn = self.reader.acquire().await?;
        free_slots(&mut conn, job, key).await
    }
}
