//! inferscope-bench: the serving benchmark (under construction).
