//! The PostgreSQL backend: a fleet of hosts shares one database. Fetches use
//! `FOR UPDATE SKIP LOCKED`; idle hosts wake on `LISTEN/NOTIFY`.
//!
//! Modules: `job` (insert, fetch, due jobs, quarantine, prune), `finish`
//! (a finish plan in one call), `lease`, `concurrency` (the gate's sweeps
//! and reports), `fleet` (hosts and job types), `operate` (listings and
//! operator commands), `unique` (uniqueness claims at enqueue), `schedule`
//! (cursors and ticks), `batch` (batches), `wait` (waiting for a job's
//! end), `pool` (the connection pools and their session settings), `writer`
//! (the connection result writes keep between writes).
//! Queries over ~15 lines are in `sql/`.
//!
//! Much of the work runs in PL/pgSQL functions, so that a hot-path step is
//! one round trip and so applications can enqueue from SQL. Each lives in
//! one file, `functions/NAME.sql`, applied after the migrations when it
//! changes (see [`functions`]); the migrations that first defined them keep
//! their earlier bodies as history. The schema's own names keep the older word "park"
//! for a blocked job (`park`, `promote_parked`, `blocked_jobs.parked_at`):
//! renaming a function every enqueue from SQL calls is not worth a
//! migration. A helper called once per statement is PL/pgSQL, not SQL,
//! when its body has a subquery: PostgreSQL plans such a SQL body afresh
//! for every statement that calls it (0034_hot_helpers_in_plpgsql); on the
//! result write's path such a lookup is a join instead (0035).
//!
//! | Function | Its history in migrations | Does |
//! |---|---|---|
//! | `notify_available` | 0012_quiet_promotions (first 0001_queue) | trigger: wakes idle hosts on insert |
//! | `render_key` | 0002_sql_enqueue | a key template over a payload |
//! | `fetch` | 0024_rate_limits (first 0003, then 0007) | leases available jobs (a pinned plan), with their `while_executing` claims, after the rate check |
//! | `rate_governed` | 0034_hot_helpers_in_plpgsql (first 0024_rate_limits) | whether a type's starts are counted |
//! | `rate_key`, `rate_start` | 0024_rate_limits | a job's rate key; a fetch's starts recorded, the rest sent back to wait |
//! | `slot_limit`, `take_slot` | 0004_concurrency | a key's limit; one slot |
//! | `park`, `discard` | 0043_claims_found_by_key_functions (first 0004_concurrency) | the gate, one job |
//! | `promote_parked` | 0043_claims_found_by_key_functions (first 0004_concurrency) | a key's blocked jobs promoted into its free slots |
//! | `release_slots`, `release_slots_leasing`, `fetch_ahead` | 0013_promotions_leased (first 0004_concurrency; `release_slots_leasing` then 0024_rate_limits, 0035_promotion_without_helpers and 0043, `fetch_ahead` then 0034_hot_helpers_in_plpgsql) | slots given back, blocked jobs promoted; those the writing host's fetch would lease go in leased |
//! | `promotable_keys`, `semaphore_page`, `repair_semaphores` | 0011_paged_sweeps (first 0004) | maintenance sweeps, a page of keys at a time |
//! | `promote_due` | 0004_concurrency | due jobs through the gate |
//! | `finish_runs` | 0043_claims_found_by_key_functions (first 0004_concurrency, then 0012, 0013) | a batch of results, and the next fetch; announces only promotions it did not lease |
//! | `keep_newest_errors` | 0005_fault_tolerance | trigger: bounds a job's errors |
//! | `unpaused` | 0034_hot_helpers_in_plpgsql (first 0005_fault_tolerance) | the queues not paused |
//! | `finish_runs_unless_locked` | 0016_lock_order (first 0005_fault_tolerance, then 0009) | `finish_runs`, its runs' rows locked first, deferring locked keys and batches |
//! | `expire_leases` | 0043_claims_found_by_key_functions (first 0016_lock_order, then 0017) | expired leases rescued, passing over jobs whose key or batch another transaction holds; an unconfirmed lease gives its attempt back |
//! | `expiry_charges`, `expiry_ends` | 0017_confirmed_leases | whether an expired lease spends its attempt, and ends its job |
//! | `lock_for_ending` | 0016_lock_order | a job's row, key and batch locked in the lock order, for paths that wait for them |
//! | `job_types_forward_only` | 0006_forward_registration | trigger: no older config over a newer |
//! | `claim_unique` | 0045_bulk_enqueue_by_index (first 0007_uniqueness, then 0032_plain_claims) | uniqueness claims of the SQL enqueue |
//! | `replace_waiting` | 0007_uniqueness | `on_duplicate` `replace` |
//! | `reclaim_unique` | 0033_claims_hold_their_keys (first 0007_uniqueness) | a job retried from the archive takes its key again |
//! | `release_unique_run` | 0043_claims_found_by_key_functions (first 0007_uniqueness) | trigger: a run's `while_executing` claim given back |
//! | `calendar_of` | 0008_schedules | the cron expression and zone a configuration declares |
//! | `schedules_follow_registration` | 0014_schedule_since (first 0008_schedules) | trigger: a changed calendar restarts its schedule, never before a tick already enqueued |
//! | `enqueue` | 0023_workflows (first 0002, then 0004, 0005, 0007, 0009) | the SQL enqueue, into a batch; its body is `enqueue_as` |
//! | `enqueue_as` | 0033_claims_hold_their_keys (first 0023_workflows) | the SQL enqueue with the new job's id given (a workflow step's, recorded first) |
//! | `batch_open`, `batch_close`, `batch_add_members`, `batch_uncount` | 0009_batches | batches from SQL; members counted in |
//! | `archive_ended` | 0043_claims_found_by_key_functions (first 0036_one_archive_trigger; before it `archived` in 0009_batches, `release_unique_archived` in 0007_uniqueness, `workflow_archived` in 0023_workflows) | the archive's one statement trigger: batches count their archived members, waiters are told, workflow steps end, claims are given back (by the key an archived row carries, else by job id) |
//! | `batch_settle`, `batch_callback_payload` | 0009_batches | deferred trigger: a finished batch's callbacks, once |
//! | `workflow_grow` | none (its file only) | a run's steps added to its own workflow, before its ending counts down |
//! | `workflow_jobs_ended` | none (its file only) | the archive's trigger hands on its archived jobs: those that are steps end as steps |
//! | `workflow_steps_ended`, `workflow_release` | 0023_workflows (`workflow_release` then 0043) | ended steps counted down in their dependents, which are released (or ended by their policy) in the same transaction, wave by wave |
//! | `workflow_step_archive` | 0043_claims_found_by_key_functions (first 0023_workflows) | a step that will not run, straight into the archive with its reason |
//! | `workflow_create`, `workflow_cancel` | 0023_workflows | workflows from SQL; a cancel ending waiting steps |
//! | `workflow_waits_arm`, `workflow_waits_end`, `workflow_waits_due`, `workflow_waits_arm_late` | none (their files only) | durable waits: armed when a step's dependencies end, ended once by an event, a time or a timeout, releasing the step |
//! | `event_send`, `send_event`, `event_matches` | none (their files only) | events sent in the caller's transaction, ending the waits they match |
//! | `admit`, `discard_each` | 0027_set_gate (`admit` first 0004; `discard_each` then 0043) | the gate for a set of jobs already written; discards with a reason each |
//! | `take_slots`, `insert_jobs` | 0045_bulk_enqueue_by_index (first 0027_set_gate, then 0030_gate_in_fewer_passes; `insert_jobs` also 0043) | a bulk enqueue's keys locked, counted and decided; its jobs written where the gate sent them, with their attached unique keys |
//! | `claim_and_insert_jobs` | 0044_claim_and_insert | a host's unique bulk enqueue in one call: `claim_new_keys` (attached), then `insert_jobs` for the jobs that won their keys |
//! | `enqueue_many` | 0040_enqueue_many_fewer_passes (first 0028_enqueue_many, then 0031, 0033) | the SQL bulk enqueue |
//! | `claim_new_keys` | 0045_bulk_enqueue_by_index (first 0029, then 0032, 0033, 0038, 0043) | a host's bulk enqueue: ids, claims (attached to the rows the host writes) and `while_executing` keys in one call |
//! | `schedule_upsert`, `schedule_remove` | none (their files only) | keyed schedules written and removed in the caller's transaction |
//! | `claims_likely_new` | 0039_likely_new_without_counting (first 0032_plain_claims) | whether to try a call's claims as a plain insert |

mod audit;
mod batch;
mod concurrency;
mod deploy;
mod event;
mod finish;
mod fleet;
pub mod functions;
mod grant;
mod history;
mod job;
mod keyed_schedule;
mod lease;
mod membership;
mod migrate;
mod operate;
mod pool;
mod rate;
mod schedule;
mod secret;
mod session;
mod token;
mod trace;
mod unique;
mod variable;
mod wait;
mod webhook;
mod workflow;
mod writer;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::driver::SchemaDriver;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool};
use tokio::sync::{Notify, OnceCell};

use super::batch::PreparedBatch;
use super::enqueue::{Configs, PreparedJob};
use super::finish::{FinishPlan, Written};
use super::schedule::TickWrite;
use super::{Backend, EnqueueLimits, Enqueued, FetchParams, Result};

/// The PostgreSQL migrations this binary carries, for a test that runs
/// them with one more ([`PgStore::schema_migrate_by`]).
pub fn carried_migrations() -> &'static sqlx::migrate::Migrator {
    crate::store::migrations::postgres()
}

/// The channel on which inserts and requeues announce available jobs.
const CHANNEL: &str = "jobhost_available";

/// The channel on which a fetch announces jobs it sent back to wait for a
/// start (jobhost.rate_start), so every host's timer of due jobs looks again.
const DUE_CHANNEL: &str = "jobhost_due";

/// A connection pool to the jobhost schema of one PostgreSQL database.
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    /// The maintenance sweeps' connections, whose lock waits are bounded
    /// (`pool::sweeps`), apart from `pool`, whose sessions wait.
    sweeps: PgPool,
    /// The LISTEN connections (new jobs; waited-for jobs' ends), apart from
    /// `pool`, so listening never takes a connection the work needs.
    listeners: PgPool,
    /// The ends of waited-for jobs, for every waiter of this store.
    announcements: wait::Announcements,
    options: PgConnectOptions,
    wake: Arc<Notify>,
    /// Woken by a deployment change (or a lost listener, which may have missed one).
    deployed: Arc<Notify>,
    /// Woken when a fetch sent jobs back to wait for a start (or a lost listener).
    due: Arc<Notify>,
    listening: Arc<OnceCell<()>>,
    /// The connection result writes go out on, apart from `pool`.
    writer: Arc<writer::Writer>,
    /// What every enqueue through this store may carry.
    limits: EnqueueLimits,
    /// How this store's next bulk enqueue of unique jobs claims their keys.
    claims: Arc<unique::ClaimPath>,
}

impl PgStore {
    /// Connects to `url` with at most `max_connections` connections.
    ///
    /// # Errors
    /// The URL is invalid or the server cannot be reached.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self> {
        Self::connect_bounded(url, max_connections, None).await
    }

    /// [`PgStore::connect`], each statement of its pool given up after
    /// `statement_timeout` when one is given: for the HTTP server, whose
    /// requests must not hold a connection (or the database) past their
    /// deadline, whatever a filter asks of the archive.
    ///
    /// # Errors
    /// As [`PgStore::connect`].
    pub async fn connect_bounded(url: &str, max_connections: u32, statement_timeout: Option<Duration>) -> Result<Self> {
        let options = pool::session_options(url.parse()?);
        pool::reachable(&options).await?;
        let pool = pool::work(&options, max_connections, statement_timeout).await?;
        let sweeps = pool::sweeps(&options);
        let listeners = pool::listeners(&options);
        let writer = Arc::new(writer::Writer::new(pool::work_options(&options, statement_timeout)));
        Ok(PgStore {
            pool,
            sweeps,
            listeners,
            announcements: wait::Announcements::default(),
            options,
            wake: Arc::new(Notify::new()),
            deployed: Arc::new(Notify::new()),
            due: Arc::new(Notify::new()),
            listening: Arc::new(OnceCell::new()),
            writer,
            limits: EnqueueLimits::default(),
            claims: Arc::default(),
        })
    }

    /// Holds every enqueue through this store to `limits`.
    pub fn with_limits(self, limits: EnqueueLimits) -> Self {
        PgStore { limits, ..self }
    }

    /// Applies the migrations up to `target` (all when `None`), each
    /// without holding a table the fleet writes for longer than a moment
    /// (see [`migrate`]): for upgrades staged a migration at a time, and the
    /// tests that run each migration under a working fleet.
    ///
    /// # Errors
    /// As [`Store::schema_migrate`].
    pub async fn schema_migrate_to(&self, target: Option<i64>) -> Result<()> {
        migrate::run(&self.options, carried_migrations(), target).await
    }

    /// Applies `migrator`'s migrations rather than the ones this binary
    /// carries ([`carried_migrations`]), as `migrate` does: for tests of
    /// migrating itself, with a migration no release carries.
    #[doc(hidden)]
    pub async fn schema_migrate_by(&self, migrator: &sqlx::migrate::Migrator) -> Result<()> {
        migrate::run(&self.options, migrator, None).await
    }

    /// The pool, for tests that check invariants with their own SQL.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Starts the LISTEN task once; notifications wake `job_wait_available`
    /// (new jobs) and `deployments_wait` (deployment changes).
    async fn listen(&self) {
        let started = self
            .listening
            .get_or_try_init(|| async {
                let mut listener = PgListener::connect_with(&self.listeners).await?;
                listener.listen_all([CHANNEL, deploy::CHANNEL, DUE_CHANNEL]).await?;
                let (wake, deployed, due) = (self.wake.clone(), self.deployed.clone(), self.due.clone());
                tokio::spawn(async move {
                    loop {
                        // `try_recv` reports a lost connection (`None`)
                        // before it reconnects at the next call: whatever
                        // was announced meanwhile is lost, so both waiters
                        // are woken to look for themselves.
                        match listener.try_recv().await {
                            Ok(Some(note)) if note.channel() == deploy::CHANNEL => deployed.notify_one(),
                            Ok(Some(note)) if note.channel() == DUE_CHANNEL => due.notify_one(),
                            Ok(Some(_)) => wake.notify_one(),
                            Ok(None) => {
                                tracing::warn!("notification listener lost its connection; reconnecting");
                                wake.notify_one();
                                deployed.notify_one();
                                due.notify_one();
                            }
                            Err(error) => {
                                tracing::warn!(%error, "notification listener cannot reconnect; retrying");
                                wake.notify_one();
                                deployed.notify_one();
                                due.notify_one();
                                tokio::time::sleep(Duration::from_millis(500)).await;
                            }
                        }
                    }
                });
                Ok::<(), sqlx::Error>(())
            })
            .await;
        if let Err(error) = started {
            tracing::warn!(%error, "cannot LISTEN for new jobs and deployments; polling only");
        }
    }
}

#[async_trait]
impl Backend for PgStore {
    fn limits(&self) -> &EnqueueLimits {
        &self.limits
    }

    async fn configs_read(&self, names: &[String]) -> Result<Configs> {
        fleet::job_types_get(&self.pool, names).await
    }

    async fn keyed_schedules_held(
        &self,
        schedules: &[(String, String)],
    ) -> Result<std::collections::HashSet<(String, String)>> {
        keyed_schedule::held(&self.pool, schedules).await
    }

    async fn jobs_write(&self, jobs: Vec<PreparedJob>) -> Result<Vec<Enqueued>> {
        let mut tx = self.pool.begin().await?;
        let enqueued = job::insert_bulk(&mut tx, &jobs.iter().collect::<Vec<_>>(), Some(&self.claims)).await?;
        tx.commit().await?;
        Ok(enqueued)
    }

    async fn batch_write(&self, batch: PreparedBatch) -> Result<(i64, Vec<Enqueued>)> {
        batch::write(&self.pool, batch).await
    }

    async fn plan_write(&self, plan: &FinishPlan, next: Option<&FetchParams>) -> Result<Written> {
        let (written, any_available) = match self.writer.lend().await? {
            Some(mut lent) => {
                let written = finish::write(lent.connection(), plan, next).await?;
                lent.give_back();
                written
            }
            None => finish::write(&mut *self.pool.acquire().await?, plan, next).await?,
        };
        if any_available {
            // This host's own idle fetch loop need not wait for the
            // notification's round trip through the server.
            self.wake.notify_one();
        }
        Ok(written)
    }

    async fn writes_warm(&self) -> Result<()> {
        self.writer.warm().await
    }

    async fn ticks_write(&self, write: TickWrite) -> Result<Option<Vec<Enqueued>>> {
        schedule::write(&self.pool, write).await
    }

    async fn backfill_write(
        &self,
        change: &crate::store::audit::Change<'_>,
        job: &str,
        key: &str,
        jobs: Vec<(chrono::DateTime<chrono::Utc>, crate::store::enqueue::PreparedJob)>,
    ) -> Result<Option<crate::store::backend::BackfillWritten>> {
        keyed_schedule::backfill_write(&self.pool, change, job, key, jobs).await
    }

    async fn quarantine_write(&self, id: i64, reason: &str, keep_errors: bool) -> Result<bool> {
        job::quarantine(&self.sweeps, id, reason, keep_errors).await
    }
}

#[async_trait]
impl SchemaDriver for PgStore {
    fn location(&self) -> String {
        let o = &self.options;
        format!("postgres://{}:{}/{}", o.get_host(), o.get_port(), o.get_database().unwrap_or_default())
    }

    async fn schema_migrate(&self) -> Result<()> {
        self.schema_migrate_to(None).await
    }

    async fn database_ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn schema_present(&self) -> Result<bool> {
        let mut conn = self.pool.acquire().await?;
        Ok(!applied_migrations(&mut conn).await?.is_empty())
    }
}

/// Commits `tx` when `work` succeeded; otherwise rolls it back before
/// returning the error. A transaction merely dropped sends its rollback
/// later, from the pool, and until then keeps the rows it locked: a caller
/// retrying part of the work at once (maintenance isolating a bad row) would
/// find them locked and pass them over.
async fn commit_or_roll_back<T>(tx: sqlx::Transaction<'_, sqlx::Postgres>, work: Result<T>) -> Result<T> {
    match work {
        Ok(value) => {
            tx.commit().await?;
            Ok(value)
        }
        Err(error) => {
            if let Err(rollback) = tx.rollback().await {
                tracing::debug!(%rollback, "rollback after a failed statement failed; the pool closes the connection");
            }
            Err(error)
        }
    }
}

/// Announces available jobs to idle hosts when the transaction commits.
async fn notify_available(conn: &mut sqlx::PgConnection) -> Result<()> {
    sqlx::query("SELECT pg_notify($1, '')").bind(CHANNEL).execute(conn).await?;
    Ok(())
}

/// The versions of the migrations the database records as applied (none on a new database).
async fn applied_migrations(conn: &mut sqlx::PgConnection) -> Result<Vec<i64>> {
    let recorded: bool =
        sqlx::query_scalar("SELECT to_regclass('jobhost._sqlx_migrations') IS NOT NULL").fetch_one(&mut *conn).await?;
    if !recorded {
        return Ok(Vec::new());
    }
    Ok(sqlx::query_scalar("SELECT version FROM jobhost._sqlx_migrations").fetch_all(conn).await?)
}
