//! The browser console (docs/console.md): the page, history, recent requests
//! and findings are `inferscope-console`'s, which the proxy serves too; the
//! engine-step timeline ([`steps`]) reads the engines and stays here.

pub mod steps;

pub use inferscope_console::{Authorize, Console, Diagnose, Serving};
