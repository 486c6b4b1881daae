#!/bin/bash
# usage: ./queue610.sh NAME "ENV=VALUE ..." [XARGS]: queue.sh on seeds 6-8 and 9-10
A="6 7 8" B="9 10" exec "$(dirname "$0")/queue.sh" "$@"
