//! inferscope-server: the OpenAI-compatible server (under construction).
