// retry.js: fetch JSON with retries and exponential backoff.
//
// Usage:
//   const { fetchJson } = require("./retry");
//   const data = await fetchJson("https://example.com/api/items", { retries: 4 });

const DEFAULT_OPTIONS = {
  retries: 3,        // number of retries after the first attempt
  baseDelayMs: 250,  // delay before the first retry
  maxDelayMs: 4000,  // upper bound for any single delay
  timeoutMs: 10000,  // abort a single request after this long
};

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function backoffDelay(attempt, options) {
  // attempt 0 -> base, 1 -> 2 * base, 2 -> 4 * base, ...
  const exponential = options.baseDelayMs * 2 ** attempt;
  const jitter = Math.random() * options.baseDelayMs;
  return Math.min(exponential + jitter, options.maxDelayMs);
}

function isRetryable(status) {
  // Retry on rate limiting and server errors, never on other client errors.
  return status === 429 || status >= 500;
}

async function fetchOnce(url, options) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), options.timeoutMs);
  try {
    return await fetch(url, { ...options.init, signal: controller.signal });
  } finally {
    clearTimeout(timer);
  }
}

async function fetchJson(url, userOptions = {}) {
  const options = { ...DEFAULT_OPTIONS, ...userOptions };
  let lastError;

  for (let attempt = 0; attempt <= options.retries; attempt++) {
    try {
      const response = await fetchOnce(url, options);
      if (response.ok) {
        return await response.json();
      }
      if (!isRetryable(response.status)) {
        throw new Error(`HTTP ${response.status} for ${url} (not retried)`);
      }
      lastError = new Error(`HTTP ${response.status} for ${url}`);
    } catch (error) {
      if (error.message.includes("not retried")) {
        throw error;
      }
      lastError = error;
    }

    if (attempt < options.retries) {
      const delay = backoffDelay(attempt, options);
      console.warn(`Attempt ${attempt + 1} failed, retrying in ${Math.round(delay)} ms`);
      await sleep(delay);
    }
  }

  throw lastError;
}

module.exports = { fetchJson, backoffDelay, isRetryable };
