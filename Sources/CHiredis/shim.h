#pragma once
#include <hiredis.h>
