//! The one parser of the Prometheus text exposition (format 0.0.4) and
//! OpenMetrics 1.0: `# HELP` / `# TYPE` / `# UNIT` metadata, `# EOF`,
//! samples with escaped label values, timestamps and exemplars.
//!
//! Two entry points share one line parser:
//! - [`parse`] is strict (for tests and conformance checks): the first
//!   malformed line, a sample outside the family declared before it, or
//!   content after `# EOF` is an error.
//! - [`parse_lenient`] is for clients reading any server (bench, doctor,
//!   top): malformed lines are counted in [`Exposition::skipped`] and
//!   skipped, and samples without metadata form untyped families.

use std::collections::BTreeMap;

/// An exemplar attached to a sample (`… # {trace_id="abc"} 0.05 1700000000.1`).
#[derive(Debug, Clone, PartialEq)]
pub struct Exemplar {
    /// The exemplar's labels.
    pub labels: BTreeMap<String, String>,
    /// The exemplar's value.
    pub value: f64,
    /// The exemplar's timestamp, if given.
    pub timestamp: Option<f64>,
}

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Sample name as exposed (with `_total`, `_bucket`, … suffixes).
    pub name: String,
    /// Labels, sorted by key.
    pub labels: BTreeMap<String, String>,
    /// Sample value.
    pub value: f64,
    /// Timestamp as written (milliseconds in 0.0.4, seconds in OpenMetrics).
    pub timestamp: Option<f64>,
    /// The exemplar that followed the value, if any.
    pub exemplar: Option<Exemplar>,
}

impl Sample {
    /// A sample without timestamp or exemplar.
    pub fn new(name: impl Into<String>, labels: BTreeMap<String, String>, value: f64) -> Self {
        Sample {
            name: name.into(),
            labels,
            value,
            timestamp: None,
            exemplar: None,
        }
    }

    /// The value of label `k`, if present.
    pub fn label(&self, k: &str) -> Option<&str> {
        self.labels.get(k).map(String::as_str)
    }

    /// Whether the sample is named `name` and carries every label in `filter`.
    pub fn matches(&self, name: &str, filter: &[(&str, &str)]) -> bool {
        self.name == name && filter.iter().all(|(k, v)| self.label(k) == Some(*v))
    }
}

/// One metric family: its metadata and samples.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MetricFamily {
    /// Name from the `# TYPE` / `# HELP` line (a sample's name when untyped).
    pub name: String,
    /// Type word (`counter`, `gauge`, `histogram`, …); empty when untyped.
    pub typ: String,
    /// HELP text, unescaped, if any.
    pub help: Option<String>,
    /// The `# UNIT` text, if any.
    pub unit: Option<String>,
    /// Samples in order.
    pub samples: Vec<Sample>,
}

/// A parsed exposition.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Exposition {
    /// Families in order.
    pub families: Vec<MetricFamily>,
    /// Whether it ended with `# EOF`.
    pub eof: bool,
    /// Lines [`parse_lenient`] could not parse (always 0 after [`parse`]).
    pub skipped: usize,
}

impl Exposition {
    /// The family of this name.
    pub fn family(&self, name: &str) -> Option<&MetricFamily> {
        self.families.iter().find(|f| f.name == name)
    }

    /// Every sample, across families.
    pub fn samples(&self) -> impl Iterator<Item = &Sample> {
        self.families.iter().flat_map(|f| f.samples.iter())
    }

    /// Every sample, across families, by value.
    pub fn into_samples(self) -> Vec<Sample> {
        self.families.into_iter().flat_map(|f| f.samples).collect()
    }

    /// Value of the sample with this name whose labels include `labels`;
    /// `None` when no sample matches.
    ///
    /// # Panics
    ///
    /// When several samples match: a test helper, where an ambiguous
    /// selector is a bug in the test.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let matches: Vec<&Sample> = self.samples().filter(|s| s.matches(name, labels)).collect();
        assert!(
            matches.len() <= 1,
            "{name} {labels:?} is ambiguous: {matches:?}"
        );
        matches.first().map(|s| s.value)
    }

    /// Number of series (samples) of a family.
    pub fn series_count(&self, family: &str) -> usize {
        self.family(family).map_or(0, |f| f.samples.len())
    }
}

/// Where strict parsing failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("line {line}: {message}: {text:?}")]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub message: String,
    /// The offending line.
    pub text: String,
}

/// Parses a sample value, including the spellings of infinities and NaN.
pub fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" | "+inf" | "inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        "NaN" | "nan" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
}

/// Strict parse: every line must be well formed and every sample must belong
/// to the family declared (`# TYPE` / `# HELP`) before it.
pub fn parse(text: &str) -> Result<Exposition, ParseError> {
    parse_with(text, true)
}

/// Lenient parse, for reading any server: malformed lines are counted and
/// skipped, never fatal; samples without metadata form untyped families.
pub fn parse_lenient(text: &str) -> Exposition {
    // Lenient mode returns no errors: every failure is counted instead.
    parse_with(text, false).unwrap_or_default()
}

/// Sample names a family of this name may hold besides its own.
const FAMILY_SUFFIXES: [&str; 6] = ["_bucket", "_sum", "_count", "_total", "_created", "_info"];

fn in_family(sample: &str, family: &str) -> bool {
    sample == family
        || FAMILY_SUFFIXES
            .iter()
            .any(|s| sample.strip_suffix(s) == Some(family))
}

/// The family named `name`, appended unless it is the last one.
fn family_mut<'a>(out: &'a mut Exposition, name: &str) -> &'a mut MetricFamily {
    if out.families.last().is_none_or(|f| f.name != name) {
        out.families.push(MetricFamily {
            name: name.to_owned(),
            ..Default::default()
        });
    }
    let last = out.families.len() - 1;
    &mut out.families[last]
}

fn parse_with(text: &str, strict: bool) -> Result<Exposition, ParseError> {
    let mut out = Exposition::default();
    for (n, raw) in text.lines().enumerate() {
        let line = if strict { raw } else { raw.trim() };
        // In strict mode the first failure is returned; leniently it is counted.
        let fail = |out: &mut Exposition, message: String| {
            if strict {
                Err(ParseError {
                    line: n + 1,
                    message,
                    text: raw.to_owned(),
                })
            } else {
                out.skipped += 1;
                Ok(())
            }
        };
        if line.is_empty() {
            continue;
        }
        if out.eof {
            fail(&mut out, "content after # EOF".into())?;
            continue;
        }
        if line == "# EOF" {
            out.eof = true;
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let mut parts = rest.trim_start().splitn(3, ' ');
            let kind = parts.next().unwrap_or("");
            let name = parts.next();
            let arg = parts.next().unwrap_or("");
            match (kind, name) {
                ("HELP", Some(name)) => family_mut(&mut out, name).help = Some(unescape_help(arg)),
                ("TYPE", Some(name)) => family_mut(&mut out, name).typ = arg.trim().to_owned(),
                ("UNIT", Some(name)) => family_mut(&mut out, name).unit = Some(arg.to_owned()),
                ("HELP" | "TYPE" | "UNIT", None) => fail(&mut out, "no metric name".into())?,
                // 0.0.4 allows free-form comments; OpenMetrics does not.
                _ if strict => fail(&mut out, format!("unknown comment {kind}"))?,
                _ => {}
            }
            continue;
        }
        let sample = match parse_sample(line) {
            Ok(s) => s,
            Err(m) => {
                fail(&mut out, m)?;
                continue;
            }
        };
        match out.families.last() {
            Some(f) if in_family(&sample.name, &f.name) => {}
            Some(f) if strict => {
                let message = format!("sample not in family {}", f.name);
                fail(&mut out, message)?;
                continue;
            }
            None if strict => {
                fail(&mut out, "sample before any TYPE".into())?;
                continue;
            }
            _ => {
                out.families.push(MetricFamily {
                    name: sample.name.clone(),
                    ..Default::default()
                });
            }
        }
        if let Some(f) = out.families.last_mut() {
            f.samples.push(sample);
        }
    }
    Ok(out)
}

/// HELP text escapes only `\\` and `\n`.
fn unescape_help(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match (c, chars.clone().next()) {
            ('\\', Some('n')) => {
                out.push('\n');
                chars.next();
            }
            ('\\', Some('\\')) => {
                out.push('\\');
                chars.next();
            }
            (c, _) => out.push(c),
        }
    }
    out
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

fn is_label_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `name{labels} value [timestamp] [# {labels} value [timestamp]]`.
fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(|c: char| !is_name_char(c)).unwrap_or(line.len());
    if name_end == 0 {
        return Err("no metric name".into());
    }
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(r) = rest.strip_prefix('{') {
        let (parsed, after) = parse_labels(r)?;
        labels = parsed;
        rest = after;
    }
    if !rest.starts_with([' ', '\t']) {
        return Err("no value".into());
    }
    let (main, exemplar) = match rest.split_once(" # ") {
        Some((main, ex)) => (main, Some(parse_exemplar(ex.trim())?)),
        None => (rest, None),
    };
    let (value, timestamp) = value_and_timestamp(main)?;
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
        timestamp,
        exemplar,
    })
}

fn value_and_timestamp(s: &str) -> Result<(f64, Option<f64>), String> {
    let mut words = s.split_whitespace();
    let value = words.next().ok_or("no value")?;
    let value = parse_value(value).ok_or_else(|| format!("bad value {value:?}"))?;
    let timestamp = match words.next() {
        Some(t) => Some(t.parse().map_err(|_| format!("bad timestamp {t:?}"))?),
        None => None,
    };
    if let Some(extra) = words.next() {
        return Err(format!("unexpected {extra:?} after the value"));
    }
    Ok((value, timestamp))
}

fn parse_exemplar(s: &str) -> Result<Exemplar, String> {
    let r = s.strip_prefix('{').ok_or("exemplar without labels")?;
    let (labels, rest) = parse_labels(r)?;
    let (value, timestamp) = value_and_timestamp(rest)?;
    Ok(Exemplar {
        labels,
        value,
        timestamp,
    })
}

/// Parses `k="v",…}` (after the `{`) and returns the labels and the text after `}`.
fn parse_labels(mut s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut labels = BTreeMap::new();
    loop {
        s = s.trim_start_matches([' ', ',']);
        if let Some(after) = s.strip_prefix('}') {
            return Ok((labels, after));
        }
        let eq = s.find('=').ok_or("label without =")?;
        let key = s[..eq].trim();
        if !is_label_name(key) {
            return Err(format!("bad label name {key:?}"));
        }
        let after = s[eq + 1..]
            .trim_start()
            .strip_prefix('"')
            .ok_or("label value not quoted")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => return Err("dangling escape".into()),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => return Err("unterminated label value".into()),
            }
        };
        if labels.insert(key.to_owned(), value).is_some() {
            return Err(format!("duplicate label {key}"));
        }
        s = &after[end + 1..];
    }
}

/// Sum of every sample named `name` whose labels include `filter` (0 when none).
pub fn sum<'a>(
    samples: impl IntoIterator<Item = &'a Sample>,
    name: &str,
    filter: &[(&str, &str)],
) -> f64 {
    samples
        .into_iter()
        .filter(|s| s.matches(name, filter))
        .map(|s| s.value)
        .sum()
}

/// Buckets `(le, cumulative count)`, `_count` and `_sum` of one series.
type HistSeries = (Vec<(f64, f64)>, Option<f64>, Option<f64>);

/// Checks one histogram's samples (`{base}_bucket`, `_sum`, `_count` of any
/// label sets): per series, buckets ascending in `le` as exposed, cumulative,
/// ending in `+Inf` equal to `_count`, with a `_sum`. Returns the series count.
fn check_histogram(base: &str, samples: &[&Sample]) -> Result<usize, String> {
    // Group by labels without `le`.
    let mut series: BTreeMap<Vec<(&str, &str)>, HistSeries> = BTreeMap::new();
    for s in samples {
        let key: Vec<(&str, &str)> = s
            .labels
            .iter()
            .filter(|(k, _)| *k != "le")
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let entry = series.entry(key).or_default();
        match s.name.strip_prefix(base).unwrap_or(&s.name) {
            "_bucket" => {
                let le = s
                    .label("le")
                    .ok_or_else(|| format!("{base}: bucket without le"))?;
                let le = parse_value(le).ok_or_else(|| format!("{base}: bad le {le:?}"))?;
                entry.0.push((le, s.value));
            }
            "_count" => entry.1 = Some(s.value),
            "_sum" => entry.2 = Some(s.value),
            other => return Err(format!("{base}: unexpected sample suffix {other:?}")),
        }
    }
    if series.is_empty() {
        return Err(format!("{base}: histogram without samples"));
    }
    let checked = series.len();
    for (labels, (buckets, count, sum)) in series {
        let ctx = format!("{base} {labels:?}");
        let count = count.ok_or_else(|| format!("{ctx}: no _count"))?;
        sum.ok_or_else(|| format!("{ctx}: no _sum"))?;
        let last = buckets.last().ok_or_else(|| format!("{ctx}: no buckets"))?;
        if last.0 != f64::INFINITY {
            return Err(format!("{ctx}: last bucket is not +Inf"));
        }
        if last.1 != count {
            return Err(format!("{ctx}: +Inf bucket {} != _count {count}", last.1));
        }
        for w in buckets.windows(2) {
            if w[1].0 <= w[0].0 {
                return Err(format!(
                    "{ctx}: le not ascending: {} then {}",
                    w[0].0, w[1].0
                ));
            }
            if w[1].1 < w[0].1 {
                return Err(format!("{ctx}: buckets not cumulative at le={}", w[1].0));
            }
        }
    }
    Ok(checked)
}

/// Checks every family typed `histogram` (see the per-series rules above).
/// Returns how many histogram series were checked.
pub fn check_histograms(expo: &Exposition) -> Result<usize, String> {
    let mut checked = 0;
    for f in expo.families.iter().filter(|f| f.typ == "histogram") {
        let samples: Vec<&Sample> = f.samples.iter().collect();
        checked += check_histogram(&f.name, &samples)?;
    }
    Ok(checked)
}

/// Like [`check_histograms`] for bare samples: every name with `_bucket`
/// samples is checked with its `_sum` and `_count`. Returns the series count.
pub fn check_histogram_samples(samples: &[Sample]) -> Result<usize, String> {
    let mut by_base: BTreeMap<&str, Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        if let Some(base) = s.name.strip_suffix("_bucket") {
            by_base.entry(base).or_default();
        }
    }
    for s in samples {
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| s.name.strip_suffix(suffix));
        if let Some(list) = base.and_then(|b| by_base.get_mut(b)) {
            list.push(s);
        }
    }
    let mut checked = 0;
    for (base, list) in by_base {
        checked += check_histogram(base, &list)?;
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    // From the bench parser.

    #[test]
    fn prometheus_004() {
        let text = "# HELP x_total Requests.\n# TYPE x_total counter\n\
                    x_total{a=\"1\",b=\"q\\\"uo\\\\te\\n\"} 3 1700000000000\n\
                    up 1\n\
                    h_bucket{le=\"+Inf\"} 5\n\
                    vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n\
                    g -Inf\nbad line here\nn NaN\n";
        let e = parse_lenient(text);
        let samples: Vec<&Sample> = e.samples().collect();
        assert_eq!(e.skipped, 1);
        assert_eq!(samples.len(), 6);
        assert_eq!(samples[0].name, "x_total");
        assert_eq!(samples[0].label("b"), Some("q\"uo\\te\n"));
        assert_eq!(samples[0].value, 3.0);
        assert_eq!(samples[0].timestamp, Some(1_700_000_000_000.0));
        assert_eq!(samples[2].value, 5.0);
        assert_eq!(
            samples[2].label("le").and_then(parse_value),
            Some(f64::INFINITY)
        );
        assert_eq!(samples[3].name, "vllm:kv_cache_usage_perc");
        assert_eq!(samples[3].label("engine"), Some("0"));
        assert_eq!(samples[4].value, f64::NEG_INFINITY);
        assert!(samples[5].value.is_nan());
        assert_eq!(
            e.family("x_total").and_then(|f| f.help.as_deref()),
            Some("Requests.")
        );
        // The same text is rejected by the strict parser, at the first bad line.
        let err = parse(text).unwrap_err();
        assert_eq!(err.line, 4, "{err}");
    }

    #[test]
    fn openmetrics_with_exemplars_and_eof() {
        let text = "# TYPE inferscope_time_to_first_token_seconds histogram\n\
                    # UNIT inferscope_time_to_first_token_seconds seconds\n\
                    inferscope_time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.1\"} 7 # {trace_id=\"abc\"} 0.05 1700000000.1\n\
                    # TYPE inferscope_request_success counter\n\
                    inferscope_request_success_total{finished_reason=\"length\", engine=\"0\"} 1.5e3\n\
                    # EOF\n";
        for e in [parse_lenient(text), parse(text).expect("strict")] {
            let samples: Vec<&Sample> = e.samples().collect();
            assert_eq!(e.skipped, 0);
            assert!(e.eof);
            assert_eq!(samples.len(), 2);
            assert_eq!(samples[0].value, 7.0);
            assert_eq!(samples[0].label("le"), Some("0.1"));
            let ex = samples[0].exemplar.as_ref().expect("exemplar");
            assert_eq!(ex.labels.get("trace_id").map(String::as_str), Some("abc"));
            assert_eq!(ex.value, 0.05);
            assert_eq!(ex.timestamp, Some(1_700_000_000.1));
            assert_eq!(samples[1].value, 1500.0);
            assert_eq!(samples[1].label("engine"), Some("0"));
            assert!(samples[1].exemplar.is_none());
            let f = e.family("inferscope_time_to_first_token_seconds");
            assert_eq!(f.and_then(|f| f.unit.as_deref()), Some("seconds"));
        }
        assert!(parse(&format!("{text}x 1\n")).is_err(), "content after EOF");
    }

    // From the metrics crate's test support.

    const GOOD: &str = "# HELP h A histogram.\n# TYPE h histogram\n\
        h_bucket{a=\"x\",le=\"1\"} 1\nh_bucket{a=\"x\",le=\"+Inf\"} 2\nh_sum{a=\"x\"} 3.5\nh_count{a=\"x\"} 2\n\
        # HELP c_total A counter.\n# TYPE c_total counter\nc_total{q=\"a\\\"b\"} 4\n";

    #[test]
    fn parses_and_checks() {
        let e = parse(GOOD).unwrap();
        assert_eq!(e.families.len(), 2);
        assert_eq!(check_histograms(&e), Ok(1));
        assert_eq!(e.value("c_total", &[("q", "a\"b")]), Some(4.0));
        assert_eq!(e.family("h").unwrap().help.as_deref(), Some("A histogram."));
        let samples = e.into_samples();
        assert_eq!(check_histogram_samples(&samples), Ok(1));
        assert_eq!(sum(&samples, "c_total", &[]), 4.0);
        assert_eq!(sum(&samples, "c_total", &[("q", "nope")]), 0.0);
    }

    #[test]
    fn detects_malformed_histograms() {
        let bad_inf = GOOD.replace("h_count{a=\"x\"} 2", "h_count{a=\"x\"} 3");
        assert!(check_histograms(&parse(&bad_inf).unwrap()).is_err());
        assert!(check_histogram_samples(&parse(&bad_inf).unwrap().into_samples()).is_err());
        let not_cumulative = GOOD.replace("le=\"1\"} 1", "le=\"1\"} 5");
        assert!(check_histograms(&parse(&not_cumulative).unwrap()).is_err());
        let no_inf = GOOD.replace("+Inf", "2");
        assert!(check_histograms(&parse(&no_inf).unwrap()).is_err());
        assert!(parse("x 1\n").is_err(), "sample without TYPE");
        assert!(
            parse("# TYPE a gauge\nb 1\n").is_err(),
            "sample outside family"
        );
    }

    // From the server tests' parser.

    #[test]
    fn labels_escapes_and_errors() {
        let e = parse("# TYPE m gauge\nm{a=\"x\\\\y\",b=\"1\\n2\"} 2.5\n").unwrap();
        let s = e.samples().next().unwrap();
        assert_eq!(s.label("a"), Some("x\\y"));
        assert_eq!(s.label("b"), Some("1\n2"));
        assert!(parse("# TYPE m gauge\nm{a=x} 1\n").is_err(), "unquoted");
        assert!(
            parse("# TYPE m gauge\nm{a=\"x\"\n").is_err(),
            "unterminated"
        );
        assert!(
            parse("# TYPE m gauge\nm{a=\"1\",a=\"2\"} 1\n").is_err(),
            "duplicate"
        );
        assert!(parse("# TYPE m gauge\nm 1 2 3\n").is_err(), "trailing text");
        assert!(parse("# TYPE m gauge\nm{a=\"1\"}1\n").is_err(), "no space");
        assert_eq!(
            parse("# HELP m a\\\\b\\nc\n# TYPE m gauge\nm 1\n")
                .unwrap()
                .families[0]
                .help
                .as_deref(),
            Some("a\\b\nc")
        );
    }
}
