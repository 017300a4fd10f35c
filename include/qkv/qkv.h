// Everything a user of qkv needs.
#pragma once

#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/error.h"
#include "qkv/explain.h"
#include "qkv/io.h"
#include "qkv/kv_cache.h"
#include "qkv/layer.h"
#include "qkv/layer_backward.h"
#include "qkv/tensor.h"
