//! A small parser of the text expositions (Prometheus 0.0.4 and OpenMetrics)
//! and well-formedness checks, for tests. Unit tests use it as a module;
//! integration tests include it with `#[path]`.
#![allow(dead_code)]

use std::collections::BTreeMap;

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Sample name (with `_bucket`, `_total`, … suffixes).
    pub name: String,
    /// Labels, sorted by key.
    pub labels: BTreeMap<String, String>,
    /// Value.
    pub value: f64,
    /// Whether an exemplar (`# {…}`) followed the value.
    pub exemplar: bool,
}

/// One metric family: its metadata and samples.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MetricFamily {
    /// Name from the `# TYPE` line.
    pub name: String,
    /// Type word.
    pub typ: String,
    /// HELP text, if any.
    pub help: Option<String>,
    /// Whether a `# UNIT` line was present.
    pub unit: bool,
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

    /// Value of the sample with this name whose labels include `labels`;
    /// `None` when no sample matches, and a panic when several do.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let matches: Vec<&Sample> = self
            .samples()
            .filter(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect();
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

fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => s.parse().map_err(|_| format!("bad value {s:?}")),
    }
}

fn parse_labels(s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    // `s` starts just after `{`.
    let mut labels = BTreeMap::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start_matches(',');
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((labels, r));
        }
        let eq = rest.find('=').ok_or("label without =")?;
        let key = rest[..eq].to_owned();
        let after = rest[eq + 1..]
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
        if labels.insert(key.clone(), value).is_some() {
            return Err(format!("duplicate label {key}"));
        }
        rest = &after[end + 1..];
    }
}

/// Parses a text exposition, checking each sample belongs to the family
/// declared before it.
pub fn parse(text: &str) -> Result<Exposition, String> {
    let mut out = Exposition::default();
    for (n, line) in text.lines().enumerate() {
        let err = |m: String| format!("line {}: {m}: {line:?}", n + 1);
        if out.eof {
            return Err(err("content after # EOF".into()));
        }
        if line.is_empty() {
            continue;
        }
        if line == "# EOF" {
            out.eof = true;
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let kind = parts.next().unwrap_or("");
            let name = parts.next().ok_or_else(|| err("no name".into()))?;
            let arg = parts.next().unwrap_or("");
            match kind {
                "HELP" => {
                    if out.families.last().is_none_or(|f| f.name != name) {
                        out.families.push(MetricFamily {
                            name: name.to_owned(),
                            ..Default::default()
                        });
                    }
                    if let Some(f) = out.families.last_mut() {
                        f.help = Some(arg.to_owned());
                    }
                }
                "TYPE" => {
                    if out.families.last().is_none_or(|f| f.name != name) {
                        out.families.push(MetricFamily {
                            name: name.to_owned(),
                            ..Default::default()
                        });
                    }
                    if let Some(f) = out.families.last_mut() {
                        f.typ = arg.to_owned();
                    }
                }
                "UNIT" => {
                    if let Some(f) = out.families.last_mut() {
                        f.unit = true;
                    }
                }
                _ => return Err(err(format!("unknown comment {kind}"))),
            }
            continue;
        }
        let name_end = line
            .find(['{', ' '])
            .ok_or_else(|| err("no value".into()))?;
        let name = &line[..name_end];
        let (labels, rest) = if line[name_end..].starts_with('{') {
            parse_labels(&line[name_end + 1..]).map_err(err)?
        } else {
            (BTreeMap::new(), &line[name_end..])
        };
        let rest = rest.trim_start();
        let (value_part, exemplar) = match rest.split_once(" # ") {
            Some((v, _)) => (v, true),
            None => (rest, false),
        };
        let value = value_part.split(' ').next().unwrap_or("");
        let value = parse_value(value).map_err(err)?;
        let family = out
            .families
            .last_mut()
            .ok_or_else(|| err("sample before any TYPE".into()))?;
        let suffix_ok = name == family.name
            || ["_bucket", "_sum", "_count", "_total", "_created", "_info"]
                .iter()
                .any(|s| name.strip_suffix(s) == Some(family.name.as_str()));
        if !suffix_ok {
            return Err(err(format!("sample not in family {}", family.name)));
        }
        family.samples.push(Sample {
            name: name.to_owned(),
            labels,
            value,
            exemplar,
        });
    }
    Ok(out)
}

/// Buckets `(le, cumulative count)`, `_count` and `_sum` of one series.
type HistSeries = (Vec<(f64, f64)>, Option<f64>, Option<f64>);

/// Checks every histogram family: buckets ascending in `le`, cumulative,
/// ending in `+Inf` equal to `_count`, with a `_sum`. Returns how many
/// histogram series were checked.
pub fn check_histograms(expo: &Exposition) -> Result<usize, String> {
    let mut checked = 0;
    for f in expo.families.iter().filter(|f| f.typ == "histogram") {
        // Group by labels without `le`.
        let mut series: BTreeMap<Vec<(String, String)>, HistSeries> = BTreeMap::new();
        for s in &f.samples {
            let key: Vec<(String, String)> = s
                .labels
                .iter()
                .filter(|(k, _)| *k != "le")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let entry = series.entry(key).or_default();
            let suffix = &s.name[f.name.len()..];
            match suffix {
                "_bucket" => {
                    let le = s
                        .labels
                        .get("le")
                        .ok_or_else(|| format!("{}: bucket without le", f.name))?;
                    entry.0.push((parse_value(le)?, s.value));
                }
                "_count" => entry.1 = Some(s.value),
                "_sum" => entry.2 = Some(s.value),
                other => return Err(format!("{}: unexpected sample suffix {other:?}", f.name)),
            }
        }
        if series.is_empty() {
            return Err(format!("{}: histogram without samples", f.name));
        }
        for (labels, (buckets, count, sum)) in series {
            let ctx = format!("{} {labels:?}", f.name);
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
            checked += 1;
        }
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn detects_malformed_histograms() {
        let bad_inf = GOOD.replace("h_count{a=\"x\"} 2", "h_count{a=\"x\"} 3");
        assert!(check_histograms(&parse(&bad_inf).unwrap()).is_err());
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
}
