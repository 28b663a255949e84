//! Debian's chromium, driven through chromedriver over WebDriver: the
//! dashboard is checked in a real browser, at desktop and phone widths,
//! with screenshots kept under `target/` to look at.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};

/// How a page is looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Screen {
    /// A laptop's window.
    Desktop,
    /// A phone held upright, emulated (viewport, pixel ratio, touch).
    Phone,
}

impl Screen {
    pub fn name(self) -> &'static str {
        match self {
            Screen::Desktop => "desktop",
            Screen::Phone => "phone",
        }
    }
}

/// A chromedriver process, killed when dropped.
pub struct Driver {
    child: Child,
    port: u16,
}

impl Driver {
    /// Starts chromedriver on a free port and waits until it says it listens.
    pub fn start() -> Driver {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut child = Command::new(chromedriver())
            .arg(format!("--port={port}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver (Debian: apt-get install chromium chromium-driver; scripts/test.sh does)");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        loop {
            match lines.next() {
                Some(Ok(line)) if line.contains("started successfully") => break,
                Some(Ok(_)) => continue,
                _ => panic!("chromedriver exited before it listened"),
            }
        }
        // Keep reading its output so it never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Driver { child, port }
    }

    /// A fresh browser session looking like `screen`.
    pub async fn session(&self, screen: Screen) -> Client {
        let mut options = json!({
            "binary": chromium(),
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--no-first-run", "--hide-scrollbars",
                "--force-color-profile=srgb", "--window-size=1366,900", "--lang=en-US",
            ],
        });
        if screen == Screen::Phone {
            options["mobileEmulation"] = json!({
                // A tall viewport so that one screenshot shows most of a page; the
                // layout depends on the width alone.
                "deviceMetrics": { "width": 390, "height": 1400, "pixelRatio": 2.0, "touch": true },
                "userAgent": "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Mobile",
            });
        }
        let mut capabilities = serde_json::Map::new();
        capabilities.insert("browserName".into(), json!("chrome"));
        capabilities.insert("goog:chromeOptions".into(), options);
        ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{}", self.port))
            .await
            .expect("a chromium session")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn chromedriver() -> String {
    std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into())
}

fn chromium() -> String {
    std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into())
}

/// Where screenshots go: `target/tmp/dashboard/`.
pub fn screenshot_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Saves the whole page (the window grown to its height, on a desktop) as
/// `NAME-SCREEN.png`.
pub async fn screenshot(client: &Client, screen: Screen, name: &str) -> PathBuf {
    if screen == Screen::Desktop {
        // The window's height holds the page's and the browser's own frame.
        let height =
            script(client, "return document.documentElement.scrollHeight + window.outerHeight - window.innerHeight")
                .await
                .as_u64()
                .unwrap_or(900);
        client.set_window_size(1366, height.clamp(600, 4000) as u32).await.unwrap();
    }
    let png = client.screenshot().await.expect("a screenshot");
    let path = screenshot_dir().join(format!("{name}-{}.png", screen.name()));
    std::fs::write(&path, png).unwrap();
    if screen == Screen::Desktop {
        client.set_window_size(1366, 900).await.unwrap();
    }
    path
}

/// Runs `body` as a function in the page and returns what it returns.
pub async fn script(client: &Client, body: &str) -> Value {
    client.execute(body, Vec::new()).await.unwrap_or_else(|e| panic!("script {body:?} failed: {e}"))
}

/// Waits until `condition` (a script body returning a boolean) holds in
/// the page, failing after `within` with `what`.
pub async fn until(client: &Client, within: Duration, what: &str, condition: &str) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if script(client, condition).await == Value::Bool(true) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The rendered text of the first element matching `css`, read in one
/// script: a live page replaces its markup between a find and a read, so
/// a found element can go stale before its text is asked for. Table cells
/// are separated by a space, as WebDriver's text has them.
pub async fn text(client: &Client, css: &str) -> String {
    let selector = serde_json::to_string(css).unwrap();
    let found = script(
        client,
        &format!("const e = document.querySelector({selector}); return e === null ? null : e.innerText.replaceAll('\\t', ' ').trim()"),
    )
    .await;
    found.as_str().unwrap_or_else(|| panic!("no {css} on the page")).to_string()
}
