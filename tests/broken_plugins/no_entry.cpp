// A shared library that is not a chiar plugin: it has no entry point.
extern "C" __attribute__((visibility("default"))) int chiar_not_a_plugin() { return 42; }
