/* tessel_rt.h: math for generated CPU kernels (placeholder). */
#pragma once
#include <stdint.h>
