//! The audit trail (docs/audit.md): every change leaves exactly one row
//! with its actor, written by the change's own transaction (a change whose
//! row cannot be written does not happen, and one rolled back leaves no
//! row); refusals are recorded, a flood of them in a bounded number of rows.

use crate::common;

use axum::http::{Method, StatusCode};
use jobhost::outbound::secrets::SecretKey;
use jobhost::store::Store;
use jobhost::store::audit::{Actor, Entry, Filter, Via};
use jobhost::store::grant::NewGrant;
use jobhost::store::keyed_schedule::KeyedSchedule;
use jobhost::store::token::{NewToken, Role};
use jobhost::store::webhook::Webhook;
use jobhost::store::{JobState, NewStep, NewWorkflow};
use jobhost::webhook::Style;
use serde_json::json;

use super::tokens::{sign_in, token};
use common::db::{TestDb, jobhost, on_both_backends};
use common::http::{TOKEN, TestServer};
use common::job_config;

/// Every row, oldest first.
async fn trail(store: &Store) -> Vec<Entry> {
    let mut rows = store.audit_list(&Filter { limit: 1000, ..Filter::default() }).await.unwrap();
    rows.reverse();
    rows
}

/// Runs `change`, then checks it left exactly one new row, of `action` on
/// `object` by `who` through `via`, and returns the row.
async fn one_row<T>(
    store: &Store,
    action: &str,
    object: &str,
    via: &str,
    who: &str,
    change: impl std::future::Future<Output = T>,
) -> Entry {
    let before = trail(store).await.len();
    change.await;
    let rows = trail(store).await;
    assert_eq!(rows.len(), before + 1, "{action} on {object} leaves one row: {:#?}", &rows[before..]);
    let row = rows.last().unwrap().clone();
    assert_eq!((row.action.as_str(), row.object.as_str()), (action, object), "{row:#?}");
    assert_eq!((row.via.as_str(), row.who.as_str()), (via, who), "{row:#?}");
    row
}

/// Each change of the list in docs/audit.md, made through the store as an
/// operator, through the API with a named token and through a dashboard
/// session, leaves exactly one row naming who made it; a refused change
/// leaves one row saying so, and changes nothing.
async fn every_change_leaves_one_row_with_its_actor(db: TestDb) {
    db.store.job_types_register(&[(job_config("mail"), "v1".to_string())]).await.unwrap();
    let alice = Actor { via: Via::Cli, who: "alice@ops-box".into(), address: None, user_agent: None };
    let store = db.store.acting_as(alice);

    macro_rules! change {
        ($action:expr, $object:expr, $change:expr) => {
            one_row(&store, $action, $object, "cli", "alice@ops-box", async { $change.unwrap() }).await
        };
    }
    let row = change!("queue.pause", "queue mail", store.queue_pause("mail").await);
    assert_eq!(row.outcome, "paused");
    change!("queue.resume", "queue mail", store.queue_resume("mail").await);
    let grant = NewGrant { job_type: "mail".into(), origin: "https://api.example.com".into(), ..Default::default() };
    let row = change!("grant.set", "grant mail https://api.example.com", store.grant_set(&grant).await);
    assert_eq!(row.outcome, "created");
    change!(
        "grant.revoke",
        "grant mail https://api.example.com",
        store.grant_revoke("mail", "https://api.example.com").await
    );
    let key = SecretKey::generate().unwrap();
    let secret = "sk_live_never_in_the_trail";
    change!("secret.set", "secret API_KEY", store.secret_set("API_KEY", &key.seal("API_KEY", secret).unwrap()).await);
    change!("secret.delete", "secret API_KEY", store.secret_delete("API_KEY").await);
    change!("var.set", "variable mail REGION", store.var_set("mail", "REGION", "eu").await);
    change!("var.unset", "variable mail REGION", store.var_unset("mail", "REGION").await);
    let webhook = Webhook {
        name: "stripe".into(),
        event_key: "stripe.{type}".into(),
        style: Style::Stripe,
        secret: "whsec_never_in_the_trail".into(),
        tolerance_secs: 300,
        created_at: chrono::Utc::now(),
    };
    change!("webhook.set", "webhook stripe", store.webhook_set(&webhook).await);
    change!("webhook.delete", "webhook stripe", store.webhook_delete("stripe").await);
    let schedule = KeyedSchedule::new("mail", "acme", "0 9 * * *");
    let row = change!("schedule.set", "schedule mail/acme", store.keyed_schedule_upsert(&schedule).await);
    assert_eq!(row.outcome, "created");
    change!("schedule.pause", "schedule mail/acme", store.keyed_schedule_pause("mail", "acme", true, None).await);
    change!("schedule.resume", "schedule mail/acme", store.keyed_schedule_pause("mail", "acme", false, None).await);
    change!("schedule.trigger", "schedule mail/acme", store.keyed_schedule_trigger("mail", "acme").await);
    change!("schedule.remove", "schedule mail/acme", store.keyed_schedule_remove("mail", "acme").await);
    let job = db.enqueue_new("mail", json!({"to": "a@example.com"})).await;
    let object = format!("job {job}");
    one_row(&store, "job.cancel", &object, "cli", "alice@ops-box", async { store.job_cancel(job).await.unwrap() })
        .await;
    one_row(&store, "job.retry", &object, "cli", "alice@ops-box", async { store.job_retry(job).await.unwrap() }).await;
    let steps = vec![NewStep::new("only", "mail", json!({}))];
    let workflow = store.workflow_create(&NewWorkflow { label: None, steps }).await.unwrap().id;
    let object = format!("workflow {workflow}");
    let before = trail(&store).await.len();
    store.workflow_cancel(workflow).await.unwrap().unwrap();
    let rows = trail(&store).await;
    let cancels: Vec<_> = rows[before..].iter().filter(|r| r.action == "workflow.cancel").collect();
    assert_eq!(cancels.len(), 1, "{:#?}", &rows[before..]);
    assert_eq!(cancels[0].object, object);
    let sent = one_row(&store, "event.send", "event order.paid", "cli", "alice@ops-box", async {
        store.event_send("order.paid", &json!({}), None, "cli").await.unwrap()
    })
    .await;
    assert!(sent.outcome.contains("released 0 waits"), "{sent:#?}");
    let desk = NewToken {
        name: "desk".into(),
        digest: "0".repeat(64),
        role: Role::Operate,
        queues: None,
        payloads: false,
        expires_at: None,
        created_by: "alice@ops-box".into(),
    };
    let row = change!("token.create", "token desk", store.token_create(&desk).await);
    assert_eq!(row.outcome, "created");
    change!("token.revoke", "token desk", store.token_revoke("desk").await);

    // A refused change: one row saying so, and nothing changed.
    let finished = db.enqueue_new("mail", json!({})).await;
    store.job_cancel(finished).await.unwrap();
    let object = format!("job {finished}");
    let refused = one_row(&store, "job.cancel", &object, "cli", "alice@ops-box", async {
        store.job_cancel(finished).await.unwrap_err()
    })
    .await;
    assert!(refused.outcome.starts_with("refused: "), "{refused:#?}");
    assert_eq!(db.state_of(finished).await, JobState::Cancelled);

    // Through the API with a named token, and through a dashboard session.
    let server = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    let ops = token(&db, "ops", Role::Operate, None).await;
    let queued = db.enqueue_new("mail", json!({})).await;
    let object = format!("job {queued}");
    let row = one_row(&db.store, "job.cancel", &object, "api", "ops", async {
        let path = format!("/api/jobs/{queued}/cancel");
        let answer = server
            .send_with(
                Method::POST,
                &path,
                None,
                &[("authorization", &format!("Bearer {ops}")), ("user-agent", "deploy-bot/2.1")],
            )
            .await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    })
    .await;
    assert_eq!(row.address.as_deref(), Some("127.0.0.1"), "{row:#?}");
    assert_eq!(row.user_agent.as_deref(), Some("deploy-bot/2.1"), "{row:#?}");
    let (cookie, csrf) = sign_in(&server, &ops).await;
    let row = one_row(&db.store, "job.retry", &object, "dashboard", "ops", async {
        let form = Some(("application/x-www-form-urlencoded", format!("csrf={csrf}")));
        let answer =
            server.send_with(Method::POST, &format!("/jobs/{queued}/retry"), form, &[("cookie", &cookie)]).await;
        assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    })
    .await;
    assert_eq!(row.outcome, "retried");

    // No secret's value, no webhook's secret, no payload is in the trail.
    let text = serde_json::to_string(&trail(&db.store).await).unwrap();
    for kept_out in [secret, "whsec_never_in_the_trail", "a@example.com", ops.as_str()] {
        assert!(!text.contains(kept_out), "{kept_out} is in the trail");
    }
}

/// A change whose row cannot be written does not happen: the row and the
/// change are one transaction, on both backends.
async fn a_change_whose_row_fails_is_rolled_back_with_it(db: TestDb) {
    db.execute(db.dialect(
        "ALTER TABLE jobhost.audit ADD CONSTRAINT no_pauses CHECK (action <> 'queue.pause')",
        "CREATE TRIGGER no_pauses BEFORE INSERT ON audit WHEN NEW.action = 'queue.pause'
         BEGIN SELECT RAISE(ABORT, 'no pauses'); END",
    ))
    .await;
    assert!(db.store.queue_pause("mail").await.is_err());
    assert!(db.store.job_stats().await.unwrap().paused_queues.is_empty(), "the pause rolled back with its row");
    assert!(trail(&db.store).await.is_empty());
    db.store.var_set("mail", "REGION", "eu").await.unwrap();
    assert_eq!(trail(&db.store).await.len(), 1, "other changes are recorded");
}

/// 10,000 wrong tokens from one address leave a handful of rows, the last
/// of each kind carrying how many came.
async fn a_flood_of_wrong_tokens_leaves_a_bounded_number_of_rows(db: TestDb) {
    let server = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    for attempt in 0..10_000 {
        let answer = server.send(Method::GET, "/api/stats", None, Some(&format!("jh_wrong_{attempt}"))).await;
        assert!([StatusCode::UNAUTHORIZED, StatusCode::TOO_MANY_REQUESTS].contains(&answer.status));
    }
    let rows = trail(&db.store).await;
    assert!(rows.len() <= 8, "{rows:#?}");
    assert!(rows.iter().all(|r| r.action.starts_with("access.") && r.address.as_deref() == Some("127.0.0.1")));
    let most = |action: &str| rows.iter().filter(|r| r.action == action).map(|r| r.count).max().unwrap_or(0);
    assert_eq!(most("access.wrong_token"), 10, "{rows:#?}");
    assert_eq!(most("access.throttled"), 1000, "{rows:#?}");
}

on_both_backends!(
    every_change_leaves_one_row_with_its_actor,
    a_change_whose_row_fails_is_rolled_back_with_it,
    a_flood_of_wrong_tokens_leaves_a_bounded_number_of_rows,
);

/// SQL helpers record the database role, in the caller's transaction: a
/// transaction rolled back leaves no row. The CLI records the OS user;
/// `jobhost audit` shows both within 80 columns; the API and the page are
/// an admin's alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_cli_api_and_page_show_who_did_what() {
    let db = TestDb::postgres().await;
    db.store.job_types_register(&[(job_config("mail"), "v1".to_string())]).await.unwrap();
    let mut tx = db.pool().begin().await.unwrap();
    sqlx::query("SELECT jobhost.schedule_upsert('mail', 'gone', '0 9 * * *')").execute(&mut *tx).await.unwrap();
    tx.rollback().await.unwrap();
    assert!(trail(&db.store).await.is_empty(), "a rolled-back change leaves no row");
    sqlx::query("SELECT jobhost.schedule_upsert('mail', 'kept', '0 9 * * *')").execute(db.pool()).await.unwrap();
    let rows = trail(&db.store).await;
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!((rows[0].via.as_str(), rows[0].who.as_str()), ("sql", "postgres"), "{rows:#?}");
    assert_eq!((rows[0].action.as_str(), rows[0].outcome.as_str()), ("schedule.set", "created"));
    // An application's own login role, granted only what writing a
    // schedule needs (nothing on the trail), is recorded by name.
    let app = format!("app_{}", std::process::id());
    for sql in [
        format!("DROP ROLE IF EXISTS {app}"),
        format!("CREATE ROLE {app} LOGIN"),
        format!("GRANT USAGE ON SCHEMA jobhost TO {app}"),
        format!("GRANT SELECT ON jobhost.job_types, jobhost.time_zones TO {app}"),
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON jobhost.keyed_schedules TO {app}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql)).execute(db.pool()).await.unwrap();
    }
    let as_app = db.url.replacen("postgres@", &format!("{app}@"), 1);
    assert_ne!(as_app, db.url, "the test database's URL names its user");
    let app_pool = sqlx::PgPool::connect(&as_app).await.unwrap();
    sqlx::query("SELECT jobhost.schedule_upsert('mail', 'app', '0 9 * * *')").execute(&app_pool).await.unwrap();
    app_pool.close().await;
    let rows = trail(&db.store).await;
    assert_eq!((rows[1].via.as_str(), rows[1].who.as_str()), ("sql", app.as_str()), "{rows:#?}");
    for sql in [format!("DROP OWNED BY {app}"), format!("DROP ROLE {app}")] {
        sqlx::query(sqlx::AssertSqlSafe(sql)).execute(db.pool()).await.unwrap();
    }
    // A job's own change is its run's, not the trail's: the completion
    // path marks its transaction so.
    let mut tx = db.pool().begin().await.unwrap();
    sqlx::query("SELECT set_config('jobhost.actor', '-', true)").execute(&mut *tx).await.unwrap();
    sqlx::query("SELECT jobhost.schedule_remove('mail', 'kept')").execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(trail(&db.store).await.len(), 2);

    let made = jobhost(&db, &["var", "set", "mail", "REGION", "eu"]);
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let listed = jobhost(&db, &["audit", "--what", "var.", "--json"]);
    let row: serde_json::Value = serde_json::from_slice(listed.stdout.trim_ascii()).unwrap();
    assert_eq!((row["via"].as_str(), row["action"].as_str()), (Some("cli"), Some("var.set")), "{row}");
    assert_eq!(row["who"].as_str(), Some(jobhost::store::audit::os_user_at_host().as_str()), "{row}");
    let table = String::from_utf8(jobhost(&db, &["audit"]).stdout).unwrap();
    assert!(table.contains("var.set variable mail REGION · created") && table.contains("schedule.set"), "{table}");
    assert!(table.lines().all(|line| line.chars().count() <= 80), "{table}");

    let server = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    let reader = token(&db, "desk", Role::Read, None).await;
    let admin = token(&db, "root", Role::Admin, None).await;
    let refused = server.send(Method::GET, "/api/audit", None, Some(&reader)).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.body);
    let answer = server.send(Method::GET, "/api/audit?what=token.&limit=1", None, Some(&admin)).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let answer = answer.json();
    assert_eq!(answer["entries"][0]["object"], "token root", "{answer}");
    assert!(answer["next"].is_i64(), "one of two token rows, and a next page: {answer}");
    let (cookie, _) = sign_in(&server, &admin).await;
    let page = server.send_with(Method::GET, "/audit?who=desk", None, &[("cookie", &cookie)]).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("Audit trail") && page.body.contains("access.refused"), "{}", page.body);
    let (cookie, _) = sign_in(&server, &reader).await;
    let page = server.send_with(Method::GET, "/audit", None, &[("cookie", &cookie)]).await;
    assert_eq!(page.status, StatusCode::FORBIDDEN);
    assert!(!page.body.contains("href=\"/audit\""), "a reader's pages have no link to the trail");
}
