"""What `localchat bench` measures (engine speed, speculative decoding, concurrency, the
kernel limit); cli/bench*.py hold its flags and printing."""
