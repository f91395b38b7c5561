//! The OpenAI API: request and response shapes ([`protocol`]), the checks
//! that turn bad input into 4xx ([`validation`]), admission and the engine
//! requests of each choice ([`infer`]), the JSON and SSE answers
//! ([`response`]) and the structured-output fields ([`structured`]). Nothing here knows the server's state or router: the
//! handlers wire these together.

pub mod body;
pub mod infer;
pub mod protocol;
pub mod refusals;
pub mod response;
pub mod structured;
pub mod tool_parsers;
pub mod tools;
pub mod validation;
