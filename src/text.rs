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
        assert_eq!(super::millis(1_500), "1500 ms");
        assert_eq!(super::millis(120_000), "2 min");
        assert_eq!(super::millis(7_200_000), "2 h");
        assert_eq!(super::millis(0), "0 ms");
    }

    #[test]
    fn a_clipped_text_keeps_its_width_with_an_ellipsis() {
        assert_eq!(super::clip("workflow", 8), "workflow");
        assert_eq!(super::clip("workflows", 8), "workflo…");
        assert_eq!(super::clip("ééééé", 3), "éé…");
    }
}
