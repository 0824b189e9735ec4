//! Stop strings: where one ends a growing text, and how much of the text's end must be held
//! back from a stream because it may still become one. The generator and the HTTP server
//! share these rules, so a streamed text and a collected one always agree.

/// A set of stop strings (empty strings are ignored).
///
/// ```
/// let stops = weft::StopStrings::new(["\n\n", "END"]);
/// assert_eq!(stops.find("one\n\ntwo END"), Some((3, "\n\n")));
/// // "EN" may be the start of "END": a stream holds it back until it is clear.
/// assert_eq!(stops.held_back("text EN"), 2);
/// assert_eq!(stops.held_back("text"), 0);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopStrings(Vec<String>);

impl StopStrings {
    /// The non-empty strings of `strings`.
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(strings: I) -> StopStrings {
        let mut s = StopStrings::default();
        for x in strings {
            s.push(x.into());
        }
        s
    }

    /// Adds a stop string (an empty one is ignored).
    pub fn push(&mut self, s: String) {
        if !s.is_empty() {
            self.0.push(s);
        }
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The strings.
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }

    /// The earliest stop string in `text`: where it starts, and which it is.
    pub fn find<'s>(&'s self, text: &str) -> Option<(usize, &'s str)> {
        self.0
            .iter()
            .filter_map(|s| text.find(s.as_str()).map(|i| (i, s.as_str())))
            .min_by_key(|&(i, _)| i)
    }

    /// Bytes at the end of `text` that could be the beginning of a stop string.
    pub fn held_back(&self, text: &str) -> usize {
        let mut hold = 0;
        for s in &self.0 {
            for (i, _) in s
                .char_indices()
                .skip(1)
                .take_while(|&(i, _)| i <= text.len())
            {
                if text.ends_with(&s[..i]) {
                    hold = hold.max(i);
                }
            }
        }
        hold
    }
}
