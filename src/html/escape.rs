//! Text made safe to put in an HTML page: in an element or in a quoted attribute.

/// `text` with the characters HTML gives a meaning escaped (`& < > " '`), and control
/// characters (which HTML forbids, and which could hide or fake text) shown as their visible
/// pictures (`␛` for ESC) or `�`. Line breaks and tabs stay. Every name a run or a file
/// brought is written through this.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\n' | '\t' => out.push(c),
            // C0 controls as Unicode's Control Pictures (U+2400…), DEL as ␡.
            '\0'..='\u{1f}' => out.push(char::from_u32(0x2400 + c as u32).unwrap_or('\u{fffd}')),
            '\u{7f}' => out.push('\u{2421}'),
            // C1 controls, and the marks that reorder text as it is shown.
            '\u{80}'..='\u{9f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => out.push('\u{fffd}'),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn markup_quotes_ampersands_and_control_characters_are_escaped() {
        let table = [
            ("", ""),
            ("train.py", "train.py"),
            ("<script>alert(1)</script>", "&lt;script&gt;alert(1)&lt;/script&gt;"),
            ("a\" onload=\"x", "a&quot; onload=&quot;x"),
            ("it's", "it&#39;s"),
            ("R&D &amp;", "R&amp;D &amp;amp;"),
            ("ESC\u{1b}[31mred", "ESC\u{241b}[31mred"),
            ("nul\0bell\u{7}", "nul\u{2400}bell\u{2407}"),
            ("del\u{7f}", "del\u{2421}"),
            ("c1\u{85}\u{9b}", "c1\u{fffd}\u{fffd}"),
            ("abc\u{202e}fdp.exe", "abc\u{fffd}fdp.exe"),
            ("two\nlines\tand tab", "two\nlines\tand tab"),
            ("chat_é_图像", "chat_é_图像"),
        ];
        for (input, want) in table {
            assert_eq!(escape(input), want, "{input:?}");
        }
    }

    #[test]
    fn escaped_text_never_holds_a_tag_or_an_attribute_break() {
        let hostile = "</style><svg onload=alert(1)>\"'&\u{0}";
        let e = escape(hostile);
        assert!(!e.contains('<') && !e.contains('>') && !e.contains('"') && !e.contains('\''), "{e}");
        assert!(!e.chars().any(|c| c.is_control() && c != '\n' && c != '\t'), "{e:?}");
    }
}
