// The login page: post the token as JSON (never in a URL); the answer sets the login cookie.
"use strict";

document.getElementById("login").addEventListener("submit", async (event) => {
  event.preventDefault();
  const error = document.getElementById("login-error");
  error.textContent = "";
  const token = document.getElementById("token").value;
  try {
    const response = await fetch("/api/login", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ token }),
    });
    if (response.ok) {
      window.location.replace("/");
      return;
    }
    const body = await response.json().catch(() => ({}));
    error.textContent = body.error || `refused (${response.status})`;
  } catch (failure) {
    error.textContent = `the proxy did not answer: ${failure}`;
  }
});
