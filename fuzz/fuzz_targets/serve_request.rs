//! Fuzzes the server's request parsing (src/serve/request.rs): a body's JSON into the messages,
//! tools and option fields of OpenAI's chat completions, completions and responses, and of
//! Anthropic's messages (the first input byte picks which). No panic; malformed requests are
//! 400 errors with a message (see `mlex_fuzz::serve::fuzz_request`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| mlex_fuzz::serve::fuzz_request(data));
