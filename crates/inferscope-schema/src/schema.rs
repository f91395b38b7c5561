//! The metric schema: every metric's name, help, type, unit, labels and
//! buckets, in one place. The Prometheus logger registers from it, the HTTP
//! layer registers from it, and `docs/metrics.md` is generated from it.
//!
//! - [`naming`](self::naming): the namespaces and how names are spelled
//!   under each ([`Style`], [`name_prefix`]);
//! - [`buckets`](self::buckets): default bounds, the overridable groups,
//!   and parsing and validating overrides;
//! - [`catalogue`](self::catalogue): every metric's [`MetricDef`] (and its
//!   name in [`names`]), the lists the registries walk, the flags and the
//!   label values;
//! - [`markdown`](self::markdown): the metrics reference,
//!   [`render_markdown`].
//!
//! Everything is re-exported here: clients name `schema::X`.

mod buckets;
mod catalogue;
mod markdown;
mod naming;

pub use buckets::*;
pub use catalogue::*;
pub use markdown::render_markdown;
pub use naming::*;
