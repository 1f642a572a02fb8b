//! Harness for gpushare's end-to-end tests: a real `gpushared` on its own socket and
//! directories, and helpers to run real containers against it.
