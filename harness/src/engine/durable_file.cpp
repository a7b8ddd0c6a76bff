// durable_file: see durable_file.h
