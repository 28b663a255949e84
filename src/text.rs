//! Text for where people read it: shortened to fit a terminal's columns or
//! a box of the dashboard's graph; a declared duration written exactly.

/// At most `max` characters, with an ellipsis when cut.
pub fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let cut: String = text.chars().take(max.saturating_sub(1)).collect();
    format!("{cut}…")
}

/// `head` then `items` separated by commas, in lines of at most `width`
/// characters: an item that does not fit goes to the next line, indented
/// two spaces, so a list never wraps mid-item in a terminal.
pub fn wrap_list(head: &str, items: &[String], width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = head.to_string();
    let mut first_of_line = true;
    for (at, item) in items.iter().enumerate() {
        let piece = if at + 1 < items.len() { format!("{item},") } else { item.clone() };
        let with_space = if first_of_line && line.trim().is_empty() { piece.clone() } else { format!(" {piece}") };
        if !first_of_line && line.chars().count() + with_space.chars().count() > width {
            lines.push(std::mem::replace(&mut line, format!("  {piece}")));
        } else {
            line += &with_space;
        }
        first_of_line = false;
    }
    lines.push(line);
    lines
}

/// `n` and the noun that goes with it: `1 throttle`, `2 throttles`.
pub fn count(n: impl Into<i64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A declared duration in milliseconds, exactly, in its largest whole
/// unit: `1 s`, `2 min`, but `1500 ms`.
pub fn millis(ms: i64) -> String {
    match ms {
        ms if ms != 0 && ms % 3_600_000 == 0 => format!("{} h", ms / 3_600_000),
        ms if ms != 0 && ms % 60_000 == 0 => format!("{} min", ms / 60_000),
        ms if ms != 0 && ms % 1_000 == 0 => format!("{} s", ms / 1_000),
        ms => format!("{ms} ms"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_duration_is_written_in_its_largest_whole_unit() {
        assert_eq!(super::millis(1_000), "1 s");
        assert_eq!(super::count(1, "throttle", "throttles"), "1 throttle");
        assert_eq!(super::count(0, "throttle", "throttles"), "0 throttles");
        assert_eq!(super::millis(1_500), "1500 ms");
        assert_eq!(super::millis(120_000), "2 min");
        assert_eq!(super::millis(7_200_000), "2 h");
        assert_eq!(super::millis(0), "0 ms");
    }

    #[test]
    fn a_list_wraps_between_items_within_its_width() {
        let items: Vec<String> = ["available 1200000", "running 10", "scheduled 3", "blocked 37", "completed 9876543"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let lines = super::wrap_list("queue a-long-queue-name:", &items, 60);
        assert_eq!(
            lines,
            ["queue a-long-queue-name: available 1200000, running 10,", "  scheduled 3, blocked 37, completed 9876543",]
        );
        assert_eq!(super::wrap_list("queue q:", &items[..1], 80), ["queue q: available 1200000"]);
    }

    #[test]
    fn a_clipped_text_keeps_its_width_with_an_ellipsis() {
        assert_eq!(super::clip("workflow", 8), "workflow");
        assert_eq!(super::clip("workflows", 8), "workflo…");
        assert_eq!(super::clip("ééééé", 3), "éé…");
    }
}
