//! Text shortened to fit where people read it: a terminal's columns, a box
//! of the dashboard's graph.

/// At most `max` characters, with an ellipsis when cut.
pub fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let cut: String = text.chars().take(max.saturating_sub(1)).collect();
    format!("{cut}…")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_clipped_text_keeps_its_width_with_an_ellipsis() {
        assert_eq!(super::clip("workflow", 8), "workflow");
        assert_eq!(super::clip("workflows", 8), "workflo…");
        assert_eq!(super::clip("ééééé", 3), "éé…");
    }
}
