//! The dashboard in a real browser (Debian's chromium through
//! chromedriver): every page loads with jobs of every state present, at
//! desktop and phone widths, without widening the page; signing in; a
//! retry clicked on a failed job that a real host then runs; a page that
//! updates live after an enqueue; a batch's progress bar at its width; and
//! forms refused without the session or the CSRF token. Screenshots of
//! each page are kept in `target/tmp/dashboard/`.

use crate::common;

use std::time::Duration;

use axum::http::{Method, StatusCode};
use fantoccini::{Client, Locator};
use jobhost::store::grant::NewGrant;
use jobhost::store::{EnqueueParams, FinishOutcome, JobState, NewBatch};
use jobhost::template::KeyTemplate;
use jobhost::types::{ConcurrencyConfig, OnConflict};
use serde_json::json;

use common::browser::{Driver, Screen, screenshot, script, text, until};
use common::db::TestDb;
use common::http::{TOKEN, TestServer};
use common::{TestHost, fetch_params, finish, job_config};

const WAIT: Duration = Duration::from_secs(30);

/// A fetch by a host that then left, with leases long enough that none
/// expires while the test looks at the pages.
fn departed(types: &[&str], limit: i64) -> jobhost::store::FetchParams {
    let mut params = fetch_params("departed-host", types, limit);
    params.job_types = types.iter().map(|t| (t.to_string(), 3600)).collect();
    params
}

/// What the pages show: one job of every state, a held key with a blocked
/// job, a batch a quarter done, a workflow part done. Returns (the failed
/// hello job, the batch, the workflow).
pub(crate) async fn populate(db: &TestDb) -> (i64, i64, i64) {
    let limited = |name: &str, on_conflict| {
        let mut config = job_config(name);
        config.concurrency = Some(ConcurrencyConfig {
            limit: 1,
            key: KeyTemplate::parse("{k}").unwrap(),
            duration_secs: 30,
            on_conflict,
        });
        (config, "v1".to_string())
    };
    // Mail declares two origins; one is granted, and one grant meets nothing declared.
    let mut mail = job_config("mail");
    let rule = |origin: &str, methods: &[&str], secrets: &[&str]| jobhost::types::OutboundRule {
        origin: origin.into(),
        methods: methods.iter().map(|m| m.to_string()).collect(),
        secrets: secrets.iter().map(|s| s.to_string()).collect(),
    };
    mail.outbound =
        vec![rule("https://api.mailgun.net", &["POST"], &["MAILGUN_KEY"]), rule("https://*.example.com", &[], &[])];
    for (origin, secrets) in
        [("https://api.mailgun.net", vec!["MAILGUN_KEY".to_string()]), ("https://api.stripe.com", vec![])]
    {
        let grant = NewGrant { job_type: "mail".into(), origin: origin.into(), secrets, ..Default::default() };
        db.store.grant_set(&grant).await.unwrap();
    }
    // Texts go out at most 10 a second per account.
    let mut sms = job_config("send-sms");
    sms.rate_limit = Some(jobhost::types::RateLimitConfig {
        limit: 10,
        period_ms: 1_000,
        key: KeyTemplate::parse("account:{account}").unwrap(),
    });
    let types = [
        (job_config("hello"), "v0".to_string()),
        (mail, "v1".to_string()),
        limited("blocking", OnConflict::Block),
        limited("discarding", OnConflict::Discard),
        (sms, "v1".to_string()),
    ];
    db.store.job_types_register(&types).await.unwrap();
    let enqueue = |job: &str, payload: serde_json::Value| {
        let store = db.dyn_store();
        let job = job.to_string();
        async move { store.job_enqueue(&[EnqueueParams::new(job, payload)]).await.unwrap()[0] }
    };
    // A hello that failed on a host that has left; the real host runs it again on retry.
    let failed = enqueue("hello", json!({"name": "retry me"})).await;
    let leased = db.store.job_fetch(&departed(&["hello"], 1)).await.unwrap();
    let error = FinishOutcome::Failed { error: "the mail server said no: 550 mailbox unavailable".into() };
    let mut failing = finish(&leased[0], error);
    let call = |path: &str, status: Option<u16>, error: Option<&str>, sent: u64, received: u64, ms: u64| {
        json!({"method": "POST", "origin": "https://api.mailgun.net", "path": path, "rule": "https://api.mailgun.net",
               "status": status, "error": error, "request_bytes": sent, "response_bytes": received, "ms": ms})
    };
    failing.log = json!({
        "lines": [{"level": "warn", "message": "the mail server said no"}],
        "outbound": [
            call("/v3/mg.example.com/messages", Some(550), None, 2_310, 96, 184),
            call("/v3/mg.example.com/messages", None, Some("ConnectionReadTimeout reading the response body"), 2_310, 0, 30_004),
        ],
    });
    db.store.job_finish(vec![failing]).await.unwrap();
    // Held keys: a running holder and a blocked job; a discarded one.
    enqueue("blocking", json!({"k": "tenant-1"})).await;
    enqueue("discarding", json!({"k": "tenant-1"})).await;
    db.store.job_fetch(&departed(&["blocking", "discarding"], 2)).await.unwrap();
    enqueue("blocking", json!({"k": "tenant-1"})).await;
    enqueue("discarding", json!({"k": "tenant-1"})).await;
    // A rate key with two starts, throttled for an hour by one of them.
    for _ in 0..3 {
        enqueue("send-sms", json!({"account": "acme"})).await;
    }
    let texts = db.store.job_fetch(&departed(&["send-sms"], 2)).await.unwrap();
    let run = jobhost::store::RunId { job_id: texts[0].id, lease_token: texts[0].lease_token };
    assert!(db.store.rate_throttle(run, 3_600_000).await.unwrap());
    // Waiting and cancelled mail (no host serves mail).
    enqueue("mail", json!({"to": "a@example.com"})).await;
    let later =
        EnqueueParams { delay_ms: Some(3_600_000), ..EnqueueParams::new("mail", json!({"to": "b@example.com"})) };
    db.store.job_enqueue(&[later]).await.unwrap();
    let cancelled = enqueue("mail", json!({"to": "c@example.com"})).await;
    db.store.job_cancel(cancelled).await.unwrap();
    // A batch of four, one done.
    let members: Vec<_> = (0..4)
        .map(|i| EnqueueParams { queue: Some("reports".into()), ..EnqueueParams::new("mail", json!({ "i": i })) })
        .collect();
    let label = NewBatch { label: Some("monthly reports".into()), ..NewBatch::default() };
    let (batch, _) = db.store.batch_create(&label, &members).await.unwrap();
    let mut params = departed(&["mail"], 1);
    params.queues = vec!["reports".into()];
    let one = db.store.job_fetch(&params).await.unwrap();
    db.store.job_finish(vec![finish(&one[0], common::completed())]).await.unwrap();
    (failed, batch, populate_workflow(db).await)
}

/// A workflow of `mail` steps in the `album` queue: the first completed,
/// then 14 thumbnails (one failed, one running, the rest waiting in the
/// queue, drawn as one box), two resizes and a page after them all, and a
/// notice that runs even if the page does not complete.
async fn populate_workflow(db: &TestDb) -> i64 {
    let step = |name: &str, after: Vec<String>| json!({"name": name, "job": "mail", "queue": "album", "payload": {"step": name}, "after": after});
    let thumbs: Vec<String> = (0..14).map(|i| format!("thumbnail-{i}")).collect();
    let mut steps = vec![step("extract", vec![])];
    steps.extend(thumbs.iter().map(|t| step(t, vec!["extract".into()])));
    steps.push(step("resize-large", vec!["extract".into()]));
    steps.push(step("resize-small", vec!["extract".into()]));
    let mut inputs = thumbs.clone();
    inputs.extend(["resize-large".to_string(), "resize-small".to_string()]);
    let mut page = step("build-album-page", inputs);
    page["if_failed"] = json!("run");
    steps.push(page);
    steps.push(json!({"name": "notify-owner", "job": "mail", "queue": "album",
                      "after": [{"step": "build-album-page", "if_failed": "run"}]}));
    let workflow = serde_json::from_value(json!({"label": "album 42", "steps": steps})).unwrap();
    let id = db.store.workflow_create(&workflow).await.unwrap().id;
    let mut params = departed(&["mail"], 1);
    params.queues = vec!["album".into()];
    let extract = db.store.job_fetch(&params).await.unwrap();
    db.store.job_finish(vec![finish(&extract[0], common::completed())]).await.unwrap();
    params.limit = 2;
    let two = db.store.job_fetch(&params).await.unwrap();
    let error = FinishOutcome::Failed { error: "the image is not a JPEG".into() };
    db.store.job_finish(vec![finish(&two[0], error)]).await.unwrap();
    id
}

/// The pages, as (name for the screenshot, path, text its heading has).
fn pages(failed: i64, batch: i64, workflow: i64) -> Vec<(&'static str, String, &'static str)> {
    vec![
        ("overview", "/".into(), "Overview"),
        ("jobs", "/jobs".into(), "Jobs"),
        ("failed", "/jobs?state=failed".into(), "Jobs: failed"),
        ("job", format!("/jobs/{failed}"), "Job"),
        ("keys", "/keys".into(), "Keys"),
        ("batches", "/batches".into(), "Batches"),
        ("batch", format!("/batches/{batch}"), "Batch"),
        ("workflows", "/workflows".into(), "Workflows"),
        ("workflow", format!("/workflows/{workflow}"), "Workflow"),
        ("types", "/types".into(), "Job types"),
        ("hosts", "/hosts".into(), "Hosts"),
        ("schedules", "/schedules".into(), "Schedules"),
    ]
}

/// Loads every page, checks it reads and fits the screen's width, and
/// keeps its screenshot.
async fn look_at_every_page(browser: &Client, server: &TestServer, screen: Screen, ids: (i64, i64, i64)) {
    let (failed, batch, workflow) = ids;
    for (name, path, heading) in pages(failed, batch, workflow) {
        browser.goto(&format!("{}{path}", server.url())).await.unwrap();
        let h1 = text(browser, "h1").await;
        assert!(h1.starts_with(heading), "{path}: heading {h1:?}");
        let overflow = script(browser, "return document.documentElement.scrollWidth - window.innerWidth").await;
        assert!(overflow.as_i64().unwrap() <= 0, "{path} is wider than the {} screen by {overflow} px", screen.name());
        screenshot(browser, screen, name).await;
    }
}

/// Opens `path` on a server whose reads need the token: the browser lands
/// on the sign-in form, is refused a wrong token, and with the right one
/// returns to `path`. Screenshots of the form and the refusal are kept.
async fn sign_in(browser: &Client, server: &TestServer, screen: Screen, path: &str) {
    browser.goto(&format!("{}{path}", server.url())).await.unwrap();
    until(browser, WAIT, "the sign-in form", "return document.querySelector('form.login') !== null").await;
    assert!(browser.current_url().await.unwrap().path().ends_with("/login"), "a page needs a session first");
    let overflow = script(browser, "return document.documentElement.scrollWidth - window.innerWidth").await;
    assert!(overflow.as_i64().unwrap() <= 0, "the sign-in form is wider than the {} screen", screen.name());
    screenshot(browser, screen, "sign-in").await;
    let form = browser.form(Locator::Css("form.login")).await.unwrap();
    form.set_by_name("token", "not-the-token-at-all").await.unwrap().submit().await.unwrap();
    // A submitted form navigates after the command returns: wait for the page it leads to.
    until(browser, WAIT, "the refusal", "return document.querySelector('.problem') !== null").await;
    assert!(text(browser, ".problem").await.contains("not this server's token"));
    screenshot(browser, screen, "sign-in-refused").await;
    let form = browser.form(Locator::Css("form.login")).await.unwrap();
    form.set_by_name("token", TOKEN).await.unwrap().submit().await.unwrap();
    until(browser, WAIT, "signed in", "return document.querySelector('.notice') !== null").await;
    assert_eq!(text(browser, ".notice").await, "Signed in: changes are allowed");
    let url = browser.current_url().await.unwrap();
    let back = match url.query() {
        Some(query) => format!("{}?{query}", url.path()),
        None => url.path().to_string(),
    };
    assert_eq!(back, path, "back where it started");
}

/// The state badge in the job page's heading.
async fn heading_state(browser: &Client) -> String {
    text(browser, "h1 .badge").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_in_a_real_browser() {
    let db = TestDb::postgres().await;
    // Build the guests before the clock of the leases below starts.
    common::guest("hello");
    let (failed, batch, workflow) = populate(&db).await;
    let host = TestHost::start(&db, &["hello"], |_| {}).await;
    let completed_hello =
        db.store.job_enqueue(&[EnqueueParams::new("hello", json!({"name": "Ada"}))]).await.unwrap()[0];
    common::eventually(WAIT, || async {
        db.store.job_get(completed_hello).await.unwrap().unwrap().row.state == JobState::Completed
    })
    .await;
    let server = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    // A version of hello deployed through the database, for the job types page.
    let hello = std::fs::read(common::guest("hello")).unwrap();
    let deployed = server.post_bytes("/api/deployments", "application/wasm", hello).await;
    assert_eq!(deployed.status, StatusCode::CREATED, "{}", deployed.body);
    let driver = Driver::start();

    // Signed in, every page at both widths, with each state on the overview.
    for screen in [Screen::Desktop, Screen::Phone] {
        let browser = driver.session(screen).await;
        sign_in(&browser, &server, screen, "/").await;
        look_at_every_page(&browser, &server, screen, (failed, batch, workflow)).await;
        // The graph: a box per step, the 14 thumbnails as one, each coloured by state.
        browser.goto(&format!("{}/workflows/{workflow}", server.url())).await.unwrap();
        let boxes = script(&browser, "return document.querySelectorAll('.graph svg g.node').length").await;
        assert_eq!(boxes, 6, "extract, the thumbnails, two resizes, the page, the notice");
        let states = script(
            &browser,
            "return [...document.querySelectorAll('.graph g.node')].map(g => g.getAttribute('class')).join(' ')",
        )
        .await;
        for state in ["state-completed", "state-failed", "state-available", "state-waiting"] {
            assert!(states.as_str().unwrap().contains(state), "{state} in {states}");
        }
        let graph = text(&browser, ".graph").await;
        assert!(graph.contains("thumbnail-… ×14"), "{graph}");
        let color =
            script(&browser, "return getComputedStyle(document.querySelector('.graph g.state-completed rect')).stroke")
                .await;
        assert_eq!(color, "rgb(47, 133, 90)", "a completed step is drawn in the completed colour");
        // Declared origins beside the grants, and a run's requests as a table.
        browser.goto(&format!("{}/types", server.url())).await.unwrap();
        let types = text(&browser, "main").await;
        for shown in [
            "Outbound HTTP",
            "https://api.mailgun.net granted https://api.mailgun.net (any declared method; secrets MAILGUN_KEY) POST MAILGUN_KEY",
            "not granted\njobhost grant mail 'https://*.example.com'",
            "granted, but allows nothing: the component does not declare it",
        ] {
            assert!(types.contains(shown), "{shown:?} on the job types page: {types}");
        }
        browser.goto(&format!("{}/jobs/{failed}", server.url())).await.unwrap();
        let job = text(&browser, "main").await;
        for shown in ["Outbound requests", "POST https://api.mailgun.net/v3/mg.example.com/messages", "550", "30004 ms"]
        {
            assert!(job.contains(shown), "{shown:?} on the job's page: {job}");
        }
        let table =
            "[...document.querySelectorAll('h3')].find(h => h.textContent == 'Outbound requests').scrollIntoView()";
        script(&browser, table).await;
        screenshot(&browser, screen, "job-outbound").await;
        browser.goto(&format!("{}/types", server.url())).await.unwrap();
        script(
            &browser,
            "[...document.querySelectorAll('h3')].find(h => h.textContent == 'Outbound HTTP').scrollIntoView()",
        )
        .await;
        screenshot(&browser, screen, "types-outbound").await;
        browser.goto(&server.url()).await.unwrap();
        let stats = db.store.job_stats().await.unwrap();
        for state in JobState::ALL {
            let card = text(&browser, &format!(".card.state-{}", state.as_str())).await;
            let expected = stats.states[&state];
            assert!(expected > 0, "a job in state {state} is on show");
            assert_eq!(card.split_whitespace().collect::<Vec<_>>(), [expected.to_string().as_str(), state.as_str()]);
        }
        browser.close().await.unwrap();
    }

    let browser = driver.session(Screen::Desktop).await;
    // A server that reads publicly shows the pages without a session, and
    // no action buttons until one signs in.
    let public = TestServer::start_public(db.dyn_store(), Some(TOKEN)).await;
    browser.goto(&format!("{}/jobs/{failed}", public.url())).await.unwrap();
    assert_eq!(heading_state(&browser).await, "failed");
    assert!(browser.find(Locator::Css("button")).await.is_err(), "actions show only when signed in");
    assert!(browser.find(Locator::LinkText("Sign in")).await.is_ok());
    // The job, from a page that needs the session: signing in returns to it.
    sign_in(&browser, &server, Screen::Desktop, &format!("/jobs/{failed}")).await;

    // Retry the failed job; the host runs it, and the page shows it without a reload.
    assert_eq!(heading_state(&browser).await, "failed");
    browser.find(Locator::XPath("//button[text()='Retry']")).await.unwrap().click().await.unwrap();
    // The sign-in's notice shows until the retry's page replaces it: wait for the retry's own.
    let retried = format!("Job {failed} will run again");
    let notice = format!("return document.querySelector('.notice')?.textContent === '{retried}'");
    until(&browser, WAIT, "the retry's notice", &notice).await;
    assert_eq!(text(&browser, ".notice").await, retried);
    script(&browser, "window.notReloaded = true; return true").await;
    until(
        &browser,
        WAIT,
        "the retried job completes on the page",
        "return document.querySelector('h1 .badge').textContent === 'completed'",
    )
    .await;
    assert_eq!(script(&browser, "return window.notReloaded === true").await, json!(true), "updated in place");
    assert!(text(&browser, "main").await.contains("hello, retry me"), "its output shows");
    assert!(browser.find(Locator::XPath("//button[text()='Retry']")).await.is_err(), "a completed job is not retried");
    screenshot(&browser, Screen::Desktop, "job-retried").await;

    // A job enqueued elsewhere appears in the open list without a reload.
    browser.goto(&format!("{}/jobs?job=mail", server.url())).await.unwrap();
    script(&browser, "window.notReloaded = true; return true").await;
    let added = server.post("/api/jobs", json!({"job": "mail", "payload": {"to": "new@example.com"}})).await.json();
    let added = added["id"].as_i64().unwrap();
    let link = format!("return document.querySelector('a[href=\"/jobs/{added}\"]') !== null");
    until(&browser, WAIT, "the new job shows in the list", &link).await;
    assert_eq!(script(&browser, "return window.notReloaded === true").await, json!(true), "updated in place");

    // The batch's bar is a quarter full, at the bar's width.
    browser.goto(&format!("{}/batches/{batch}", server.url())).await.unwrap();
    let widths = script(
        &browser,
        "const bar = document.querySelector('main .progress');
         return [bar.getBoundingClientRect().width, bar.querySelector('.fill').getBoundingClientRect().width]",
    )
    .await;
    let (bar, fill) = (widths[0].as_f64().unwrap(), widths[1].as_f64().unwrap());
    assert!(bar > 100.0 && (fill / bar - 0.25).abs() < 0.01, "fill {fill} of {bar}");
    assert_eq!(text(&browser, "main .progress .value").await, "25%");

    // A workflow with a failed step shows it in red beside the completed
    // part: never a solid green bar.
    browser.goto(&format!("{}/workflows/{workflow}", server.url())).await.unwrap();
    let parts =
        script(&browser, "return [...document.querySelectorAll('main .progress .fill')].map(f => f.className)").await;
    assert_eq!(parts, json!(["fill state-completed", "fill state-failed"]), "{parts}");

    // Pause a queue from the overview, and resume it.
    browser.goto(&server.url()).await.unwrap();
    browser
        .find(Locator::XPath("//tr[th/a[text()='reports']]//button[text()='Pause']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser.accept_alert().await.unwrap();
    let notice = |start: &str| {
        format!("const n = document.querySelector('.notice'); return n !== null && n.textContent.startsWith('{start}')")
    };
    until(&browser, WAIT, "the pause's notice", &notice("Queue reports paused")).await;
    assert_eq!(db.store.job_stats().await.unwrap().paused_queues, ["reports"]);
    browser
        .find(Locator::XPath("//tr[th/a[text()='reports']]//button[text()='Resume']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until(&browser, WAIT, "the resume's notice", &notice("Queue reports resumed")).await;
    assert!(db.store.job_stats().await.unwrap().paused_queues.is_empty());
    browser.close().await.unwrap();
    host.stop().await;
}

/// The charts of the fleet over time: drawn from the history a host's
/// jobs left, readable at both widths, their values shown on hover or tap,
/// a deploy marked on the type's own page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charts_show_the_fleet_over_time() {
    let db = TestDb::sqlite().await;
    let host = TestHost::start(&db, &["hello", "flaky"], |_| {}).await;
    for i in 0..12 {
        db.enqueue_new("hello", json!({"name": format!("c{i}")})).await;
    }
    let mut flaky = Vec::new();
    for _ in 0..3 {
        flaky.push(db.enqueue_new("flaky", json!({"fail_times": 9})).await);
    }
    common::eventually(WAIT, || async { db.scalar("SELECT count(*) FROM archive").await == 15 }).await;
    host.stop().await;
    let server = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    let hello = std::fs::read(common::guest("hello")).unwrap();
    let deployed = server.post_bytes("/api/deployments", "application/wasm", hello).await;
    assert_eq!(deployed.status, StatusCode::CREATED, "{}", deployed.body);
    db.store.history_roll(7.0 * 86_400.0).await.unwrap();
    let api = server.get("/api/history?range=1h").await.json();
    let points = api["points"].as_array().unwrap();
    assert_eq!(points.len(), 60);
    let completed: i64 = points.iter().map(|p| p["completed"].as_i64().unwrap()).sum();
    assert_eq!(completed, 12);
    let flaky_history = server.get("/api/history?range=1h&type=flaky").await.json();
    let retried: i64 = flaky_history["points"].as_array().unwrap().iter().map(|p| p["retried"].as_i64().unwrap()).sum();
    assert_eq!(retried, 3 * 4, "every attempt but the last of each job");
    assert_eq!(server.get("/api/history?range=2h").await.status, StatusCode::BAD_REQUEST);

    let driver = Driver::start();
    for screen in [Screen::Desktop, Screen::Phone] {
        let browser = driver.session(screen).await;
        sign_in(&browser, &server, screen, "/").await;
        let charts =
            script(&browser, "return [...document.querySelectorAll('figure.chart')].map(f => f.dataset.chart)").await;
        assert_eq!(charts, json!(["Throughput", "Queue depth"]));
        let overflow = script(&browser, "return document.documentElement.scrollWidth - window.innerWidth").await;
        assert!(overflow.as_i64().unwrap() <= 0, "the overview is wider than the {} screen", screen.name());
        // The bars of the minutes the jobs finished in, and their values
        // in the readout when pointed at.
        let drawn = script(&browser, "return document.querySelectorAll('figure.chart rect.completed').length").await;
        assert!(drawn.as_i64().unwrap() >= 1, "completed bars drawn");
        let event = if screen == Screen::Phone { "click" } else { "mouseover" };
        let readout = script(
            &browser,
            &format!(
                "const chart = document.querySelector('figure.chart');
                 const hits = [...chart.querySelectorAll('rect.hit')];
                 const hit = hits.find(h => h.querySelector('title').textContent.match(/completed [1-9]/));
                 hit.dispatchEvent(new MouseEvent('{event}', {{bubbles: true}}));
                 return chart.querySelector('.readout').textContent"
            ),
        )
        .await;
        assert!(readout.as_str().unwrap().contains(" UTC: completed "), "{readout}");
        screenshot(&browser, screen, "overview-charts").await;
        let width =
            script(&browser, "return document.querySelector('figure.chart svg').getBoundingClientRect().width").await;
        assert!(width.as_f64().unwrap() > 250.0, "the plot takes the chart's width: {width}");

        // A day: a point per 15 minutes.
        browser.goto(&format!("{}/?range=24h", server.url())).await.unwrap();
        let hits =
            script(&browser, "return document.querySelector('figure.chart').querySelectorAll('rect.hit').length").await;
        assert_eq!(hits, 96);

        // The type's page: its charts, the deploy marked and listed.
        browser.goto(&format!("{}/types/hello", server.url())).await.unwrap();
        let charts =
            script(&browser, "return [...document.querySelectorAll('figure.chart')].map(f => f.dataset.chart)").await;
        assert_eq!(charts, json!(["Throughput", "Run time", "Failures", "Wait before start", "Queue depth"]));
        let marks = script(&browser, "return document.querySelectorAll('figure.chart line.mark').length").await;
        assert_eq!(marks, 5, "the deploy on every chart");
        let mark = script(
            &browser,
            "const chart = document.querySelectorAll('figure.chart')[1];
             chart.querySelector('rect.mark-hit').dispatchEvent(new MouseEvent('click', {bubbles: true}));
             return chart.querySelector('.readout').textContent",
        )
        .await;
        assert!(mark.as_str().unwrap().starts_with("deploy "), "{mark}");
        let overflow = script(&browser, "return document.documentElement.scrollWidth - window.innerWidth").await;
        assert!(overflow.as_i64().unwrap() <= 0, "the type's page is wider than the {} screen", screen.name());
        screenshot(&browser, screen, "type-charts").await;
        browser.goto(&format!("{}/types/flaky", server.url())).await.unwrap();
        let failures = script(
            &browser,
            "const chart = document.querySelectorAll('figure.chart')[2];
             const hit = [...chart.querySelectorAll('rect.hit')].find(h => h.querySelector('title').textContent.match(/retried [1-9]/));
             hit.dispatchEvent(new MouseEvent('click', {bubbles: true}));
             return chart.querySelector('.readout').textContent",
        )
        .await;
        // All in one minute, unless the jobs straddled a minute's turn.
        assert!(failures.as_str().unwrap().contains(" UTC: failed "), "{failures}");
        assert!(failures.as_str().unwrap().contains(" attempts, retried "), "{failures}");
        screenshot(&browser, screen, "type-flaky").await;
        // A failed job's attempts, oldest first, with the waits between.
        browser.goto(&format!("{}/jobs/{}", server.url(), flaky[0])).await.unwrap();
        let endings = script(
            &browser,
            "return [...document.querySelectorAll('ol.attempts li.attempt .badge')].map(b => b.textContent)",
        )
        .await;
        assert_eq!(endings, json!(["retried", "retried", "retried", "retried", "failed"]));
        let waits = script(&browser, "return document.querySelectorAll('ol.attempts li.wait').length").await;
        assert_eq!(waits, 4, "a backoff before each attempt after the first");
        let first = text(&browser, "ol.attempts li.attempt").await;
        assert!(first.starts_with("Attempt 1 retried on ") && first.contains("attempt 1 failed on purpose"), "{first}");
        let overflow = script(&browser, "return document.documentElement.scrollWidth - window.innerWidth").await;
        assert!(overflow.as_i64().unwrap() <= 0, "the job's page is wider than the {} screen", screen.name());
        script(&browser, "document.querySelector('ol.attempts').scrollIntoView(); return true").await;
        screenshot(&browser, screen, "job-attempts").await;
        browser.goto(&format!("{}/types/nothing-by-that-name", server.url())).await.unwrap();
        assert_eq!(text(&browser, "h1").await, "Not found");
        browser.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forms_need_the_session_and_its_csrf_token() {
    let db = TestDb::sqlite().await;
    db.store.job_types_register(&[(job_config("mail"), "v1".to_string())]).await.unwrap();
    let id = db.store.job_enqueue(&[EnqueueParams::new("mail", json!({}))]).await.unwrap()[0];
    let server = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    let form = |body: &str| Some(("application/x-www-form-urlencoded", body.to_string()));
    let signed_in = server.send(Method::POST, "/login", form(&format!("token={TOKEN}&return_to=/")), None).await;
    assert_eq!(signed_in.status, StatusCode::SEE_OTHER);
    let cookie = signed_in
        .headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap())
        .find(|c| c.starts_with(&format!("jobhost_session_{}=", server.address.port())))
        .unwrap();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"), "{cookie}");
    let session = cookie.split(';').next().unwrap().to_string();
    let page = server.send_with(Method::GET, &format!("/jobs/{id}"), None, &[("cookie", &session)]).await;
    let csrf = page.body.split("name=\"csrf\" value=\"").nth(1).unwrap().split('"').next().unwrap().to_string();
    assert_eq!(csrf.len(), 64);
    // A page carrying the token is never cached, framed or given scripts from elsewhere.
    assert_eq!(page.headers["cache-control"], "no-store");
    assert_eq!(page.headers["x-frame-options"], "DENY");
    let policy = page.headers["content-security-policy"].to_str().unwrap();
    assert!(policy.contains("script-src 'self'") && policy.contains("frame-ancestors 'none'"), "{policy}");
    let cancel = format!("/jobs/{id}/cancel");
    let body = |csrf: &str| form(&format!("csrf={csrf}&return_to=/jobs/{id}"));
    let refused = server.send(Method::POST, &cancel, body(&csrf), None).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "no session");
    let forged = server.send_with(Method::POST, &cancel, body("0".repeat(64).as_str()), &[("cookie", &session)]).await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN, "a wrong CSRF token");
    let elsewhere = [("cookie", session.as_str()), ("origin", "http://evil.example")];
    assert_eq!(server.send_with(Method::POST, &cancel, body(&csrf), &elsewhere).await.status, StatusCode::FORBIDDEN);
    assert_eq!(db.store.job_get(id).await.unwrap().unwrap().row.state, JobState::Available, "nothing changed");
    let done = server.send_with(Method::POST, &cancel, body(&csrf), &[("cookie", &session)]).await;
    assert_eq!(
        (done.status, done.headers["location"].to_str().unwrap()),
        (StatusCode::SEE_OTHER, format!("/jobs/{id}").as_str())
    );
    assert_eq!(db.store.job_get(id).await.unwrap().unwrap().row.state, JobState::Cancelled);
    // A form never sends the browser to another site, however the path is spelled.
    for away in ["//evil.example/", "/%09/evil.example", "/\t/evil.example", "https://evil.example/"] {
        let body = form(&format!("csrf={csrf}&return_to={}", away.replace('\t', "%09")));
        let answer = server.send_with(Method::POST, &format!("/jobs/{id}/retry"), body, &[("cookie", &session)]).await;
        assert_eq!(answer.headers["location"], "/", "{away:?}");
    }
    let away = server
        .send_with(
            Method::POST,
            &format!("/jobs/{id}/retry"),
            form(&format!("csrf={csrf}&return_to=//evil.example/")),
            &[("cookie", &session)],
        )
        .await;
    assert_eq!(away.headers["location"], "/");
}

/// An approval: a step waiting for `order.approved` of its order says so on
/// the workflow's page, with Approve and Reject in a signed-in session (at
/// both widths, within the screen); Approve sends the event it waits for,
/// which releases the step with the decision under `_event`, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_in_a_real_browser() {
    let db = TestDb::postgres().await;
    db.store.job_types_register(&[(job_config("hello"), "v1".into())]).await.unwrap();
    let file = std::fs::read_to_string("docs/examples/approval-workflow.json").unwrap();
    let driver = Driver::start();
    let server = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    for screen in [Screen::Desktop, Screen::Phone] {
        let id = db.store.workflow_create(&serde_json::from_str(&file).unwrap()).await.unwrap().id;
        let path = format!("/workflows/{id}");
        let browser = driver.session(screen).await;
        sign_in(&browser, &server, screen, &path).await;
        let wait = text(&browser, ".wait").await;
        assert!(wait.starts_with("Waits for event order.approved {order_id=42}, 2d 23h left, then cancel"), "{wait}");
        let overflow = script(&browser, "return document.documentElement.scrollWidth - window.innerWidth").await;
        assert!(
            overflow.as_i64().unwrap() <= 0,
            "the page is wider than the {} screen by {overflow} px",
            screen.name()
        );
        script(&browser, "document.querySelector('.wait').scrollIntoView(); return true").await;
        let cut =
            script(&browser, "const w = document.querySelector('.wait'); return w.scrollWidth - w.clientWidth").await;
        assert!(cut.as_i64().unwrap() <= 0, "the wait's line is cut on the {} screen", screen.name());
        screenshot(&browser, screen, "workflow-approval").await;
        browser.find(Locator::Css("button.decide-approve")).await.unwrap().click().await.unwrap();
        browser.accept_alert().await.unwrap();
        let notice = "const n = document.querySelector('.notice'); return n !== null && n.textContent.startsWith('Step approve approved')";
        until(&browser, WAIT, "the approval's notice", notice).await;
        assert!(text(&browser, ".notice").await.ends_with("ended 1 waits"), "{}", text(&browser, ".notice").await);
        assert!(text(&browser, ".wait").await.contains("ended by event"));
        assert!(browser.find(Locator::Css("button.decide-approve")).await.is_err(), "decided once");
        script(&browser, "document.querySelector('.wait').scrollIntoView(); return true").await;
        screenshot(&browser, screen, "workflow-approved").await;
        let step = db.store.workflow_get(id).await.unwrap().unwrap().steps.into_iter().find(|s| s.name == "approve");
        let job = db.store.job_get(step.unwrap().job_id.expect("released")).await.unwrap().unwrap();
        assert_eq!(job.payload["_event"], json!({"order_id": "42", "approved": true, "by": "dashboard"}));
        browser.close().await.unwrap();
    }
    // Without a session, no buttons; a form without its CSRF token is refused.
    let id = db.store.workflow_create(&serde_json::from_str(&file).unwrap()).await.unwrap().id;
    let forged = server
        .send(
            Method::POST,
            &format!("/workflows/{id}/decide"),
            Some(("application/x-www-form-urlencoded", "step=approve&decision=approve".into())),
            None,
        )
        .await;
    assert!(forged.status.is_client_error(), "{}", forged.status);
    let state = db.store.workflow_get(id).await.unwrap().unwrap().steps[0].state;
    assert_eq!(state, jobhost::store::StepState::Waiting, "nothing sent");
}

/// The schedules page shows those made at run time a page at a time (a
/// fleet may have hundreds of thousands), each page linking to the next
/// from where it ended.
#[tokio::test]
async fn the_schedules_page_pages_through_schedules_made_at_run_time() {
    let db = TestDb::sqlite().await;
    db.store.job_types_register(&[(common::job_config("report"), "v1".into())]).await.unwrap();
    for n in 0..105 {
        let schedule = jobhost::store::keyed_schedule::KeyedSchedule::new("report", format!("c-{n:03}"), "0 9 * * *");
        db.store.keyed_schedule_upsert(&schedule).await.unwrap();
    }
    let server = common::http::TestServer::start(db.dyn_store(), None).await;
    let first = server.get("/schedules").await.body;
    assert!(first.contains("c-099") && !first.contains("c-100"), "the first hundred");
    assert!(first.contains("href=\"/schedules?after=report%2Fc-099\""), "a link to the next page");
    let second = server.get("/schedules?after=report%2Fc-099").await.body;
    // The page's own list, not the header's sign-in link back to it.
    let second = second.split("<main").nth(1).expect("a main element").to_string();
    assert!(second.contains("c-100") && second.contains("c-104") && !second.contains("c-099"));
    assert!(second.contains("First page") && !second.contains("Next 100"), "the last page");
    assert_eq!(server.get("/schedules?after=nothing-to-split").await.status, StatusCode::BAD_REQUEST);
}

/// The schedules page with schedules made at run time, in a real browser
/// at both widths: each listed with its state (a paused one with its note),
/// the page no wider than the screen; Pause (confirmed) and Run now
/// clicked change the schedule in the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_schedules_in_a_real_browser() {
    use jobhost::store::keyed_schedule::{KeyedSchedule, Overlap};
    let db = TestDb::postgres().await;
    db.store.job_types_register(&[(job_config("weekly_report"), "v1".into())]).await.unwrap();
    let long_key = "customer:4f1d2c3b-9a8e-4b7c-8d6e-5f4a3b2c1d0e/region:eu-central-1";
    let schedules = [
        KeyedSchedule {
            time_zone: "Europe/Berlin".into(),
            overlap: Overlap::Skip,
            ..KeyedSchedule::new("weekly_report", "acme", "0 9 * * MON")
        },
        KeyedSchedule {
            overlap: Overlap::BufferOne,
            jitter_ms: 300_000,
            ..KeyedSchedule::new("weekly_report", long_key, "*/5 * * * *")
        },
        KeyedSchedule {
            paused: true,
            note: "moving to the annual plan, back in January".into(),
            ..KeyedSchedule::new("weekly_report", "globex", "0 9 1 * *")
        },
    ];
    for schedule in &schedules {
        db.store.keyed_schedule_upsert(schedule).await.unwrap();
    }
    let driver = Driver::start();
    let server = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    for screen in [Screen::Desktop, Screen::Phone] {
        db.store.keyed_schedule_pause("weekly_report", "acme", false, None).await.unwrap();
        let browser = driver.session(screen).await;
        sign_in(&browser, &server, screen, "/schedules").await;
        let page = text(&browser, "main").await;
        assert!(page.contains("Made at run time") && page.contains("moving to the annual plan"), "{page}");
        let overflow = script(&browser, "return document.documentElement.scrollWidth - window.innerWidth").await;
        assert!(
            overflow.as_i64().unwrap() <= 0,
            "the page is wider than the {} screen by {overflow} px",
            screen.name()
        );
        screenshot(&browser, screen, "schedules-keyed").await;

        let pause = "form[action='/schedules/pause'] input[name='key'][value='acme']";
        let button = browser.find(Locator::Css(pause)).await.unwrap();
        let form = button.find(Locator::XPath("..")).await.unwrap();
        form.find(Locator::Css("button")).await.unwrap().click().await.unwrap();
        browser.accept_alert().await.unwrap();
        let notice =
            "const n = document.querySelector('.notice'); return n !== null && n.textContent.includes('paused')";
        until(&browser, WAIT, "the pause's notice", notice).await;
        let acme = db.store.keyed_schedules(Some("weekly_report"), Some("acme")).await.unwrap().remove(0);
        assert!(acme.schedule.paused, "paused in the database");

        let run = format!("form[action='/schedules/trigger'] input[name='key'][value='{long_key}']");
        let input = browser.find(Locator::Css(&run)).await.unwrap();
        input
            .find(Locator::XPath(".."))
            .await
            .unwrap()
            .find(Locator::Css("button"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let notice =
            "const n = document.querySelector('.notice'); return n !== null && n.textContent.includes('triggered')";
        until(&browser, WAIT, "the trigger's notice", notice).await;
        let long = db.store.keyed_schedules(Some("weekly_report"), Some(long_key)).await.unwrap().remove(0);
        assert!(long.triggered_at.is_some(), "triggered in the database");
        screenshot(&browser, screen, "schedules-keyed-acted").await;
        browser.close().await.unwrap();
    }
}

/// The dashboard as a support desk's `read` token sees it, and as an admin
/// does, in a real browser at both widths: the reader's job page has no
/// buttons and no payload, output or log, and says why; the admin's has
/// them. Screenshots `job-as-read` and `job-as-admin`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_in_a_real_browser() {
    use sha2::{Digest, Sha256};
    let db = TestDb::postgres().await;
    let (failed, _, _) = populate(&db).await;
    let reader = format!("jh_{}", "5c1f0a9e".repeat(8));
    let support = jobhost::store::token::NewToken {
        name: "support".into(),
        digest: hex::encode(Sha256::digest(reader.as_bytes())),
        role: jobhost::store::token::Role::Read,
        queues: None,
        payloads: false,
        expires_at: None,
        created_by: "tests@here".into(),
    };
    db.store.token_create(&support).await.unwrap();
    let driver = Driver::start();
    let server = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    let path = format!("/jobs/{failed}");
    for screen in [Screen::Desktop, Screen::Phone] {
        for (value, who) in [(reader.as_str(), "read"), (TOKEN, "admin")] {
            let browser = driver.session(screen).await;
            browser.goto(&format!("{}/login?return_to={}", server.url(), path.replace('/', "%2F"))).await.unwrap();
            until(&browser, WAIT, "the sign-in form", "return document.querySelector('form.login') !== null").await;
            let form = browser.form(Locator::Css("form.login")).await.unwrap();
            form.set_by_name("token", value).await.unwrap().submit().await.unwrap();
            until(&browser, WAIT, "signed in", "return document.querySelector('.notice') !== null").await;
            let notice = text(&browser, ".notice").await;
            let retry = format!("form[action=\"/jobs/{failed}/retry\"]");
            let buttons = browser.find(Locator::Css(&retry)).await.is_ok();
            let hidden = browser.find(Locator::Css(".hidden-data")).await.is_ok();
            if who == "read" {
                assert_eq!(notice, "Signed in as support, who may read");
                assert!(!buttons, "a reader is shown no retry button");
                assert!(hidden, "a reader is told the payload is hidden");
                assert!(text(&browser, ".session").await.contains("support · read"));
            } else {
                assert!(buttons, "an admin is shown the retry button");
                assert!(!hidden, "an admin sees the payload");
            }
            let overflow = script(&browser, "return document.documentElement.scrollWidth - window.innerWidth").await;
            assert!(overflow.as_i64().unwrap() <= 0, "the page is wider than the {} screen", screen.name());
            screenshot(&browser, screen, &format!("job-as-{who}")).await;
            // The audit trail: an admin's page, linked for admins alone.
            let linked = browser.find(Locator::Css("nav a[href=\"/audit\"]")).await.is_ok();
            assert_eq!(linked, who == "admin", "the Audit link shows for admins alone");
            browser.goto(&format!("{}/audit", server.url())).await.unwrap();
            until(&browser, WAIT, "the audit page", "return document.querySelector('h1') !== null").await;
            if who == "admin" {
                assert!(text(&browser, "main").await.contains("token.create"), "the trail lists the token made");
                let overflow =
                    script(&browser, "return document.documentElement.scrollWidth - window.innerWidth").await;
                assert!(overflow.as_i64().unwrap() <= 0, "the audit page is wider than the {} screen", screen.name());
                screenshot(&browser, screen, "audit").await;
            } else {
                assert!(text(&browser, "main").await.contains("this needs the admin role"));
            }
            browser.close().await.unwrap();
        }
    }
}
