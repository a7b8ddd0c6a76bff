#pragma once
// Symbols marked CHIAR_API form the core library's public surface. Everything
// else is built with hidden visibility, so interface type info stays unique
// across the plugin boundary (dynamic_cast works from a plugin's object).
#define CHIAR_API __attribute__((visibility("default")))
