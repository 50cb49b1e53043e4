//! The `inferwatch` agent as a library: the table of built-in components, shared by the
//! binary and the end-to-end tests.

pub mod components;
