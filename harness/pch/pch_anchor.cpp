// Anchor translation unit: the target that owns the precompiled header needs one.
